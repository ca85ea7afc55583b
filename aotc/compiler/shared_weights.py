"""One copy of the weights in a package with specialized members (`aotc build --specialize`).

Each member is its own AOTInductor program with its own copy of the weights (BERT-base with three
sizes: 1.76 GB for 439 MB of weights). Here the assembled package gets the weights once, in a file
of plain tensors beside the manifest (`shared_weights` in docs/package-format.md), and each
program's archive loses its weights blob: the runtimes point every program at the same tensors
(aotc_runtime/shared_weights.py). AOTInductor supports exactly this: a program whose constants are
not in its .so (`package_constants_in_so=False`) takes them at load from `load_constants`, and with
`user_managed=True` keeps the caller's tensors instead of copying them.

A program whose constants are not exactly the ones its artifact, placed as the build placed it,
holds (a tuning candidate that folds or renames constants) keeps its own copy: what is shared is
only what provably matches.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from aotc.compiler.package_writer import write_manifest
from aotc.compiler.reproducible import normalize_archive
from aotc.config import BuildConfig
from aotc_runtime import MODEL_FILE, read_manifest
from aotc_runtime.shared_weights import OVERRIDE

WEIGHTS_FILE = "weights.pt"
BLOB_SUFFIX = "_weights.blob"  # AOTInductor's on-disk constants inside model.pt2


def share_weights(cfg: BuildConfig, staging: Path, programs: list[tuple[str, Path]]):
    """Write one weights file for `programs` [(folder, the artifact it was built from)] and strip
    their archives' weights; the manifest's SharedWeights, or None when fewer than two programs
    can share (nothing to gain)."""
    import torch

    from aotc_runtime import SharedWeights

    weights: dict = {}
    sharing = []
    for folder, artifact in programs:
        package = staging / folder
        if read_manifest(package).backend != "aotinductor" or not _has_blob(package / MODEL_FILE):
            continue
        names = constant_names(package)
        if names is None:
            continue  # the assembled check that follows says why it cannot load
        constants = placed_constants(artifact, cfg)
        if not set(names) <= set(constants):
            continue  # compiled with constants of its own: it keeps its copy
        for name in names:
            tensor = constants[name]
            if name not in weights:
                weights[name] = tensor
            elif not (
                weights[name].dtype == tensor.dtype
                and weights[name].shape == tensor.shape
                and torch.equal(weights[name], tensor)
            ):
                weights[f"{folder}{OVERRIDE}{name}"] = tensor
        sharing.append(folder)
    if len(sharing) < 2:
        return None
    torch.save(weights, staging / WEIGHTS_FILE)
    for folder in sharing:
        normalize_archive(staging / folder / MODEL_FILE, without_suffixes=(BLOB_SUFFIX,))
        if folder != ".":  # a member's own manifest hashes its archive
            write_manifest(staging / folder, read_manifest(staging / folder))
    return SharedWeights(WEIGHTS_FILE, tuple(sharing))


def placed_constants(artifact: Path, cfg: BuildConfig) -> dict:
    """The constants of `artifact` as its build compiled them (on the build's device, in its
    precision), by name, as contiguous CPU tensors."""
    from aotc.export.artifact import load_artifact
    from aotc.export.placement import place_program
    from aotc.quiet import quiet_torch

    ep, meta = load_artifact(artifact)
    with quiet_torch():
        placed = place_program(ep, cfg.device, cfg.precision, meta.signature)
    found = {**placed.state_dict, **placed.constants}
    return {name: t.detach().cpu().contiguous() for name, t in found.items() if hasattr(t, "cpu")}


def constant_names(package: Path) -> list | None:
    """The names of the constants the compiled program in `package` takes (loaded in a child
    process: aotc/compiler/constant_names_child.py); None if it cannot be loaded there."""
    import json
    import subprocess

    from aotc.child_process import child_command, child_env

    try:
        done = subprocess.run(
            child_command("aotc.compiler.constant_names_child", str(package)),
            capture_output=True,
            text=True,
            timeout=600,
            env=child_env(),
        )
        names = json.loads(done.stdout) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None
    return names if isinstance(names, list) and all(isinstance(n, str) for n in names) else None


def _has_blob(archive: Path) -> bool:
    try:
        with zipfile.ZipFile(archive) as zf:
            return any(name.endswith(BLOB_SUFFIX) for name in zf.namelist())
    except (OSError, zipfile.BadZipFile):  # the assembled check that follows refuses it
        return False
