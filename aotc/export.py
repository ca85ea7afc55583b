"""`aotc export`: user model -> ExportedProgram saved with torch.export.save (+ aotc's signature).

Steps: load the model, make the example call, run it eagerly once (a model that fails by itself is
reported as such, at the user's line; its buffers are restored after, so the artifact holds the
model's initial state), export the flat wrapper of aotc/call_structure.py with torch.export Dims,
lift the buffers forward mutates out as state, save atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .call_structure import TENSOR, OutputLayout, call_model, initial_state, make_flat_call, output_layout
from .config import ExportConfig
from .errors import ExportError, ModelError, UserInputError
from .example_call import ExampleCall, describe, example_call
from .export_problems import diagnose
from .loading import LoadedModel, load_model
from .quiet import quiet_torch
from .shapes import export_dynamic_shapes
from .user_frames import first_line, innermost_user_frame

ARTIFACT_META = "aotc.json"
ARTIFACT_KIND = "aotc-export"
STATE_PREFIX = "model."  # FlatCall holds the user's module as `model`: its buffer FQNs start with this


@dataclass
class ExportResult:
    output: Path
    model: str
    signature: dict
    seconds: float

    def to_dict(self) -> dict:
        return {"artifact": str(self.output), "model": self.model, "signature": self.signature, "seconds": round(self.seconds, 3)}


def export_model(cfg: ExportConfig) -> ExportResult:
    cfg.validate()
    started = time.perf_counter()
    import torch

    loaded, call = prepare_model(cfg)
    with torch.no_grad():
        layout = output_layout(check_eager(loaded, call))
    ep, state = export_with_state(loaded, call, layout, cfg.strict)
    signature = make_signature(ep, call, layout, state)
    if call.dims:
        check_dim_ranges(ep, signature, call)
    meta = {
        "kind": ARTIFACT_KIND,
        "aotc_version": __version__,
        "torch": torch.__version__,
        "model": loaded.description,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "signature": signature,
    }
    save_artifact(ep, meta, cfg.output)
    return ExportResult(cfg.output, loaded.description, signature, time.perf_counter() - started)


def prepare_model(cfg: ExportConfig) -> tuple[LoadedModel, ExampleCall]:
    """(loaded model with its weights, the example call to trace)."""
    loaded = load_model(cfg.model, cfg.entry)
    if cfg.weights:
        load_weights(loaded.module, cfg.weights)
    return loaded, example_call(cfg, loaded)


def load_weights(module, path: Path) -> None:
    import torch

    try:
        if path.suffix == ".safetensors":
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise UserInputError("--weights is a .safetensors file but safetensors is not installed; pip install safetensors") from None
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except UserInputError:
        raise
    except Exception as exc:
        raise UserInputError(f"--weights {path} could not be read as a state_dict: {first_line(exc)}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise UserInputError(f"--weights {path} does not fit the model: {' '.join(str(exc).split())[:400]}") from None


@contextlib.contextmanager
def buffers_restored(module):
    """Put every buffer back as it was on leaving: a forward that updates a counter or a cache must
    not leave the artifact one call ahead of the model as constructed."""
    import torch

    saved = {name: buf.detach().clone() for name, buf in module.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                owner_name, _, leaf = name.rpartition(".")
                owner = module.get_submodule(owner_name)
                current = owner._buffers.get(leaf)
                if current is not None and current.shape == value.shape and current.dtype == value.dtype:
                    current.copy_(value)  # in place: other references to the buffer see the restore too
                else:
                    owner._buffers[leaf] = value  # forward rebound it with another shape (a growing cache)


def check_eager(loaded: LoadedModel, call: ExampleCall):
    """Run the model once as plain PyTorch (state restored after) and return its output.

    If it fails here, the model is wrong, not the export.
    """
    try:
        with buffers_restored(loaded.module):
            return call_model(loaded.module, call.tensors, call.n_positional, call.keywords, call.constants)
    except Exception as exc:
        where = innermost_user_frame(exc, loaded.source_files)
        at = f" at {where}" if where else ""
        raise ModelError(
            f"the model itself fails on inputs ({describe(call)}){at}: {type(exc).__name__}: {first_line(exc)}; "
            "fix the model or the --input-shape"
        ) from exc


def flat_module(loaded: LoadedModel, call: ExampleCall, layout: OutputLayout, state: tuple = ()):
    return make_flat_call(loaded.module, call.n_positional, call.keywords, call.constants, layout.structure == TENSOR, state)


def export_with_state(loaded: LoadedModel, call: ExampleCall, layout: OutputLayout, strict: bool):
    """(ExportedProgram, [(name, initial value)] of the state lifted out of it).

    A first export shows which buffers forward mutates; if any, the model is exported again with
    those buffers as extra inputs and outputs (see aotc/call_structure.py).
    """
    ep = export_program(loaded, flat_module(loaded, call, layout), call.tensors, call.shapes, call.dims, strict)
    mutated = mutated_buffers(ep)
    if not mutated:
        return ep, []
    names = tuple(name[len(STATE_PREFIX):] for name in mutated)
    initial = [loaded.module.get_buffer(name).detach().clone() for name in names]
    ep = export_program(loaded, flat_module(loaded, call, layout, names), call.tensors + initial, call.shapes,
                        call.dims, strict, extra_static=len(initial))
    return ep, list(zip(names, initial))


def _runs_at(module, signature, sizes: dict, state: list) -> Exception | None:
    """Run the exported program on random inputs with dims at `sizes`; the error, or None."""
    import torch

    inputs = signature.random_inputs(seed=0, sizes=sizes)
    try:
        with torch.no_grad(), quiet_torch():
            module(*inputs, *[t.clone() for t in state])  # a fresh copy per run: forward may update it
        return None
    except Exception as exc:  # the model's own failure at that size, reported below
        return exc


def check_dim_ranges(ep, signature: dict, call: ExampleCall) -> None:
    """Run the program with each dynamic dim at its max and its min (the others at their example).

    torch.export proves only what shapes imply: a sequence longer than the position embeddings
    exports fine and fails at run time (index out of range). Found here, the error names the largest
    size that works (a bisection on that dim), as a flag to paste.
    """
    from aotc_runtime.signature import Signature

    module, typed = ep.module(), Signature.from_dict(signature)
    state = initial_state(ep, signature)
    example = {name: dim.example_size() for name, dim in call.dims.items()}
    for name, dim in call.dims.items():
        runs = lambda size, name=name: _runs_at(module, typed, {**example, name: size}, state) is None  # noqa: E731
        for edge, which in ((dim.max, "max"), (dim.min, "min")):
            failure = _runs_at(module, typed, {**example, name: edge}, state)
            if failure is None:
                continue
            works = _last_working(runs, good=dim.example_size(), bad=edge)  # the example runs: bisect towards the edge
            flag = dim.flag(high=works) if which == "max" else dim.flag(low=works)
            raise UserInputError(f"the model fails with {name}={edge}, the {which} of --dim {name} ({type(failure).__name__}: "
                                 f"{first_line(failure)[:120]}); it runs {'up' if which == 'max' else 'down'} to {name}={works}: {flag}")


def _last_working(runs, good: int, bad: int) -> int:
    """The size nearest `bad` for which runs(size) holds, between a size that runs and one that fails."""
    while abs(bad - good) > 1:
        middle = (good + bad) // 2
        if runs(middle):
            good = middle
        else:
            bad = middle
    return good


def mutated_buffers(ep) -> list:
    """FQNs of the buffers the program writes. torch.export's graph keeps in-place ops (`add_` on
    the buffer) and records mutations only once functionalized, so ask a functionalized copy (no
    decompositions: an empty table, well under a second for small models)."""
    with quiet_torch():
        functional = ep.run_decompositions({})
    return sorted(set(functional.graph_signature.buffers_to_mutate.values()))


def export_program(loaded: LoadedModel, module, inputs, shapes, dims, strict: bool, extra_static: int = 0):
    import torch

    try:
        with quiet_torch(), buffers_restored(loaded.module):
            return torch.export.export(module, tuple(inputs), dynamic_shapes=export_dynamic_shapes(shapes, dims, extra_static),
                                       strict=strict)
    except Exception as exc:
        problem = diagnose(exc, loaded.source_files, dims, shapes)
        raise ExportError(
            f"torch.export cannot capture {loaded.description}: {problem.one_line()}; "
            f"`aotc explain` with the same arguments lists every problem"
        ) from exc


def _symbol_names(ep, shapes) -> dict:
    """sympy symbol of each dynamic input axis -> the user's dim name."""
    names = {}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
    for node, shape in zip(placeholders, shapes):
        value = node.meta.get("val")
        for axis, entry in enumerate(shape):
            if isinstance(entry, str) and value is not None and hasattr(value.shape[axis], "node"):
                names[str(value.shape[axis].node.expr)] = entry
    return names


def _dim_text(size, names: dict):
    if isinstance(size, int):
        return size
    text = str(size.node.expr) if hasattr(size, "node") else str(size)
    for symbol, name in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(symbol, name)
    return text


# Ops an index tensor may pass through on its way to an embedding lookup (GPT-2 views its ids first).
_INDEX_PASSTHROUGH = ("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten", "clone", "contiguous", "expand", "alias")


def _embedding_rows(node) -> int | None:
    """Rows of the embedding table an integer input indexes (through views), or None."""
    import torch

    frontier, seen = [node], set()
    while frontier:
        current = frontier.pop()
        if current in seen:
            continue
        seen.add(current)
        for user in current.users:
            target = getattr(user, "target", None)
            if target is torch.ops.aten.embedding.default and len(user.args) > 1 and user.args[1] is current:
                weight = user.args[0].meta.get("val") if hasattr(user.args[0], "meta") else None
                if weight is not None and isinstance(weight.shape[0], int):
                    return int(weight.shape[0])
            name = getattr(target, "__name__", "")
            if user.op == "call_function" and name.split(".")[0] in _INDEX_PASSTHROUGH and user.args and user.args[0] is current:
                frontier.append(user)
    return None


def _value_range(node, tensor) -> list | None:
    """[low, high] random integer inputs are drawn from: an embedding's rows, else the example's range."""
    import torch

    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool or not tensor.numel():
        return None
    rows = _embedding_rows(node) if node is not None else None
    if rows is not None:
        return [0, rows - 1]
    return [int(tensor.min()), int(tensor.max())]


def make_signature(ep, call: ExampleCall, layout: OutputLayout, state: list) -> dict:
    from aotc_runtime.signature import DTYPE_NAMES

    names = _symbol_names(ep, call.shapes)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user_nodes = [placeholders.get(name) for name in ep.graph_signature.user_inputs]
    spec_inputs = []
    for index, (name, tensor, shape) in enumerate(zip(call.names, call.tensors, call.shapes)):
        spec_inputs.append({"name": name, "dtype": DTYPE_NAMES[tensor.dtype], "shape": list(shape),
                            "value_range": _value_range(user_nodes[index], tensor), "keyword": index >= call.n_positional})
    output_node = next(n for n in ep.graph.nodes if n.op == "output")
    values = [node.meta.get("val") if hasattr(node, "meta") else None for node in output_node.args[0]]
    outputs = [{"name": name, "dtype": DTYPE_NAMES.get(value.dtype, str(value.dtype)), "shape": [_dim_text(s, names) for s in value.shape]}
               for name, value in zip(layout.names, values)]
    signature = {"inputs": spec_inputs, "outputs": outputs, "dims": {n: d.to_dict() for n, d in call.dims.items()},
                 "output_structure": layout.structure}
    if layout.dropped:
        signature["dropped_outputs"] = list(layout.dropped)
    if call.constants:
        signature["constants"] = dict(call.constants)
    if state:
        signature["state"] = [{"name": name, "dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape)} for name, t in state]
    return signature


def save_artifact(ep, meta: dict, output: Path) -> None:
    """torch.export.save to a temporary name beside the target, then rename (never half-written)."""
    import torch

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.stem}.{os.getpid()}.tmp.pt2")  # torch.export.save wants a .pt2 name
    try:
        with quiet_torch():
            torch.export.save(ep, str(tmp), extra_files={ARTIFACT_META: json.dumps(meta)})
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)


def load_artifact(path: Path):
    """(ExportedProgram, meta) or a UserInputError that says this is not an aotc export artifact."""
    import torch

    extra = {ARTIFACT_META: ""}
    try:
        with quiet_torch():
            ep = torch.export.load(str(path), extra_files=extra)
    except Exception as exc:
        raise UserInputError(_unloadable_reason(path, exc)) from None
    try:
        meta = json.loads(extra[ARTIFACT_META])
    except (json.JSONDecodeError, TypeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("kind") != ARTIFACT_KIND:
        raise UserInputError(f"{path} is an ExportedProgram but not one written by `aotc export` (no signature); re-export it with `aotc export`")
    return ep, meta


def _unloadable_reason(path: Path, exc: Exception) -> str:
    """Why torch.export.load refused the file, told apart: not an export archive at all, or one that
    names Python types this process does not know (an artifact from an older aotc, or from plain
    torch.export, whose call spec holds the model's own output class)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return f"{path} is not a torch.export artifact (not a .pt2 archive); create one with `aotc export MODEL -o {path.name}`"
    unknown = next((text for text in _load_errors(path, exc) if "not registered" in text), None)
    if unknown:
        return (f"{path} is an export artifact whose inputs or outputs use Python types this process has not imported "
                f"({' '.join(unknown.split())[:160]}); re-export it with this aotc, whose artifacts hold only tensors and builtins")
    return (f"{path} is a .pt2 archive that torch {_torch_version()} cannot load as an ExportedProgram "
            f"({type(exc).__name__}: {first_line(exc)[:120]}); re-export it with `aotc export` on this torch")


def _torch_version() -> str:
    import torch

    return torch.__version__


def _load_errors(path: Path, exc: Exception) -> list:
    """The texts of the failure's exception chain, and of the archive reader's own error.

    torch.export.load only logs the reader's error (which names a type it cannot rebuild) and then
    raises "check the warnings above"; reading the archive again, on this error path only, recovers it.
    """
    texts, seen = [], exc
    while seen is not None and len(texts) < 10:
        texts.append(" ".join(str(seen).split()))
        seen = seen.__cause__ or seen.__context__
    try:
        from torch.export.pt2_archive._package import load_pt2

        with quiet_torch():
            load_pt2(str(path))
    except Exception as inner:  # the reader's own error: what the log line would have shown
        seen = inner
        while seen is not None and len(texts) < 20:
            texts.append(" ".join(str(seen).split()))
            seen = seen.__cause__ or seen.__context__
    return texts
