"""`aotc build --specialize B=1,8,16`: static-shape artifacts for listed sizes of a dynamic dim.

A dynamic-shape model pays for its generality: Inductor cannot pick kernel configurations or unroll
for a size it does not know, and a batch of 1 runs kernels tuned for any batch (docs/benchmarks.md:
densenet121 at batch 1, the dynamic package 1.705 ms against torch.compile's specializing
reduce-overhead 1.396 ms). A JIT specializes at the first call; an ahead-of-time build specializes
for the sizes the user names, and the runtime dispatches on the input's size (aotc_runtime.Package.route).

The static artifact is the exported program re-exported at those sizes (torch.export of the
program's own module, as torch.export's docs allow), the other dynamic dims kept dynamic with their
ranges; its signature is the artifact's with the dims fixed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from aotc.errors import UserInputError
from aotc.export.artifact import ArtifactMeta, load_artifact, save_artifact
from aotc.quiet import quiet_torch


def parse_specialize(text: str) -> tuple[str, tuple[int, ...]]:
    """'B=1,8,16' -> ('B', (1, 8, 16)); ValueError with the expected form otherwise."""
    name, sep, sizes = text.partition("=")
    name = name.strip()
    values = []
    for raw in sizes.split(","):
        item = raw.strip()
        if not item.isdigit():
            values = []
            break
        if int(item) not in values:
            values.append(int(item))
    if not sep or not name or not values:
        raise ValueError(
            f"'{text}' is not DIM=SIZE[,SIZE...]; give a dynamic dim and its sizes, e.g. B=1,8,16"
        )
    return name, tuple(values)


def check_specialize(signature: dict, name: str, sizes: tuple) -> None:
    """The dim exists and is dynamic, every size is in its range, and the model has no state."""
    dims = signature.get("dims") or {}
    if signature.get("state"):
        raise UserInputError(
            "--specialize: this model carries state between calls, which members of other sizes "
            "could not share; build it without --specialize"
        )
    if name not in dims:
        known = ", ".join(sorted(dims)) or "none: every input shape is static"
        raise UserInputError(
            f"--specialize {name}: the artifact has no dynamic dim {name} (its dynamic dims: {known}); "
            "name one of them, or re-export with --dim"
        )
    low, high = dims[name]["min"], dims[name]["max"]
    outside = [s for s in sizes if not low <= s <= high]
    if outside:
        raise UserInputError(
            f"--specialize {name}={','.join(map(str, outside))}: outside {name}'s range {low}..{high}; "
            f"choose sizes in that range or re-export with a wider --dim {name}=MIN:MAX"
        )


def specialized_artifact(artifact: Path, sizes: dict, output: Path) -> None:
    """Write `output`: the artifact with the dims in `sizes` fixed at those sizes."""
    import torch

    from aotc.export.signature import _dim_text, _symbol_names
    from aotc_runtime import Signature, sha256_file

    ep, meta = load_artifact(artifact)
    signature = Signature.from_json(meta.signature)
    kept = {n: d for n, d in signature.dims.items() if n not in sizes}
    shapes = [spec.shape for spec in signature.specialized(sizes)]
    export_dims = {n: torch.export.Dim(n, min=d["min"], max=d["max"]) for n, d in kept.items()}
    per_input = [
        {axis: export_dims[e] for axis, e in enumerate(shape) if isinstance(e, str)} or None
        for shape in shapes
    ]
    inputs = signature.random_inputs(seed=0, sizes=sizes)
    try:
        with quiet_torch():
            static = torch.export.export(
                ep.module(),
                tuple(inputs),
                dynamic_shapes=(tuple(per_input),) if kept else None,
                strict=False,
            )
    except Exception as exc:
        from aotc.errors import BuildError
        from aotc.export.user_frames import first_line

        label = ",".join(f"{n}={s}" for n, s in sizes.items())
        raise BuildError(
            f"--specialize {label}: the program could not be re-exported at that size "
            f"({type(exc).__name__}: {first_line(exc)[:200]}); leave that size out"
        ) from exc
    data = dict(meta.signature)
    data["inputs"] = [
        {**spec, "shape": list(shape)} for spec, shape in zip(meta.signature["inputs"], shapes)
    ]
    data["dims"] = {n: dict(d) for n, d in kept.items()}
    names = _symbol_names(static, shapes)
    out_node = next(n for n in static.graph.nodes if n.op == "output")
    values = [node.meta.get("val") for node in out_node.args[0]]
    data["outputs"] = [
        {**spec, "shape": [_dim_text(s, names) for s in value.shape]}
        for spec, value in zip(meta.signature["outputs"], values)
    ]
    derived = {"sha256": sha256_file(artifact), "sizes": dict(sizes)}
    new = dataclasses.replace(ArtifactMeta.new(meta.model, data), derived_from=derived)
    save_artifact(static, new, output)


def derivation_problem(
    path: Path, source_sha256: str, source_signature: dict, sizes: dict
) -> str | None:
    """Why the specialized artifact at `path` is not the artifact with sha256 `source_sha256` (and
    signature `source_signature`) re-exported at `sizes`, or None. A cached file is an input like
    any other: what it claims is checked, and its inputs must be the source's with those dims
    fixed. Its program is checked where it counts: the assembled package's numeric check runs
    against the source's eager run (aotc/tune/driver.py)."""
    from aotc.export.artifact import read_artifact_meta
    from aotc_runtime import Signature

    try:
        meta = read_artifact_meta(path)
    except UserInputError as exc:
        return f"it is not a readable artifact ({exc})"
    derived = meta.derived_from or {}
    if derived.get("sha256") != source_sha256:
        return "it records another source artifact" if derived else "it records no source artifact"
    if derived.get("sizes") != dict(sizes):
        return f"it records sizes {derived.get('sizes')}, not {dict(sizes)}"
    try:
        inputs = Signature.from_json(meta.signature).inputs
    except ValueError:  # a FieldError: the signature is not readable
        return "its signature is not readable"
    return Signature.from_json(source_signature).specialization_difference(
        sizes, inputs, "the source's"
    )
