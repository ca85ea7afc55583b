"""Reading inputs from .npy/.npz/.pt files and writing outputs to .npz/.pt."""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import InputMismatchError


def read_inputs(paths) -> list:
    """Tensors in positional order: each .npy is one input; an .npz or .pt may hold several, in order."""
    tensors = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise InputMismatchError(f"input file {path} does not exist; pass .npy, .npz or .pt files with --input")
        suffix = path.suffix.lower()
        try:
            if suffix == ".npy":
                import numpy

                tensors.append(torch.from_numpy(numpy.load(path, allow_pickle=False)))
            elif suffix == ".npz":
                import numpy

                with numpy.load(path, allow_pickle=False) as archive:
                    tensors.extend(torch.from_numpy(archive[key]) for key in archive.files)
            elif suffix == ".pt":
                tensors.extend(_tensors_from_pt(torch.load(path, weights_only=True), path))
            else:
                raise InputMismatchError(f"input file {path} has an unknown type '{suffix}'; use .npy, .npz or .pt")
        except InputMismatchError:
            raise
        except Exception as exc:
            raise InputMismatchError(f"input file {path} could not be read ({type(exc).__name__}: {exc}); pass a valid {suffix} file") from None
    return tensors


def _tensors_from_pt(obj, path: Path) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in obj):
        return list(obj)
    if isinstance(obj, dict) and all(isinstance(t, torch.Tensor) for t in obj.values()):
        return list(obj.values())
    raise InputMismatchError(f"{path} must hold a tensor, or a list/tuple/dict of tensors, got {type(obj).__name__}")


def flatten_outputs(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    from torch.utils import _pytree as pytree

    return [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]


def write_outputs(result, path) -> None:
    """All outputs to .npz as output_0, output_1, ... or to .pt as a list; written atomically."""
    path = Path(path)
    outputs = [t.detach().cpu() for t in flatten_outputs(result)]
    suffix = path.suffix.lower()
    if suffix not in (".npz", ".pt"):
        raise InputMismatchError(f"output file {path} must end in .npz or .pt")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if suffix == ".npz":
            import numpy

            with open(tmp, "wb") as handle:
                numpy.savez(handle, **{f"output_{i}": _to_numpy(t) for i, t in enumerate(outputs)})
        else:
            torch.save(outputs, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _to_numpy(tensor):
    # numpy has no bfloat16: widen it rather than fail.
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()
