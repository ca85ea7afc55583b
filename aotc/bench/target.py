"""What `aotc bench` is pointed at, checked before anything is timed: the device the package runs
on here, the artifact it was built from (its baselines' source), the batch sizes to time."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from aotc.bench.options import BenchConfig
from aotc.errors import UserInputError

if TYPE_CHECKING:
    import torch

    from aotc_runtime import Manifest, Signature


def bench_device(cfg: BenchConfig, manifest: Manifest) -> torch.device:
    """The torch.device the package runs on here; a UserInputError if this machine has none."""
    import torch

    device = torch.device("cuda", 0) if manifest.device.type == "cuda" else torch.device("cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError(
            f"package {cfg.package} is a CUDA package but this machine has no usable GPU; bench it on a GPU machine"
        )
    return device


def resolve_artifact(cfg: BenchConfig, manifest: Manifest) -> Path:
    """The .pt2 the package was built from (or --artifact), checked against the manifest's sha256."""
    from aotc_runtime import sha256_file

    source = manifest.source
    if cfg.artifact is not None:
        path = Path(cfg.artifact)
    elif source is not None:
        path = Path(source.artifact)
        if not path.is_file():
            raise UserInputError(
                f"{path}, the artifact package {cfg.package} was built from, is gone; pass --artifact "
                "PATH to a copy of it"
            )
    else:
        raise UserInputError(
            f"package {cfg.package} does not say which artifact it was built from; pass --artifact MODEL.pt2"
        )
    if source is not None and sha256_file(path) != source.sha256:
        raise UserInputError(
            f"{path} is not the artifact package {cfg.package} was built from (sha256 differs); "
            "pass --artifact with that .pt2, or rebuild the package from this one"
        )
    return path


def batch_axis(signature: Signature):
    """(dim name or static size or None, example size) of the first axis of the first input."""
    inputs = signature.inputs
    if not inputs or not inputs[0].shape:
        return None, 1
    first = inputs[0].shape[0]
    if isinstance(first, str):
        return first, signature.dims[first]["example"]
    return first, first


def resolve_batch_sizes(signature: Signature, requested: tuple) -> tuple:
    axis, example = batch_axis(signature)
    if not requested:
        return (example,)
    if isinstance(axis, str):
        low, high = signature.dims[axis]["min"], signature.dims[axis]["max"]
        outside = [b for b in requested if not low <= b <= high]
        if outside:
            raise UserInputError(
                f"--batch-sizes {','.join(map(str, outside))}: the package's batch dim {axis} ranges {low}..{high}; "
                f"re-export with a wider --dim {axis}=MIN:MAX or choose sizes in that range"
            )
        return tuple(requested)
    if any(b != example for b in requested):
        name = signature.inputs[0].name if signature.inputs else "the input"
        raise UserInputError(
            f"--batch-sizes {','.join(map(str, requested))}: the first axis of {name} is static "
            f"({axis}) in this package; "
            f"re-export with a named dim (--input-shape Bx... --dim B=MIN:MAX) or leave --batch-sizes out"
        )
    return tuple(requested)
