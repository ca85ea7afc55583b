"""Reading inputs from .npy/.npz/.pt files and writing outputs to .npz/.pt."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .errors import InputMismatchError
from .files import replaced_atomically


def read_inputs(
    paths: Sequence[str | os.PathLike], names: Sequence[str] = ()
) -> list[torch.Tensor]:
    """Tensors in positional order: each .npy is one input; an .npz or .pt may hold several, in order.

    An .npz (or a .pt dict) whose keys are all input names of the package (`names`) is read by
    name instead: its arrays go to the inputs they name, whatever their order in the file.
    """
    tensors = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise InputMismatchError(
                f"input file {path} does not exist; pass .npy, .npz or .pt files with --input"
            )
        suffix = path.suffix.lower()
        try:
            if suffix == ".npy":
                import numpy

                tensors.append(torch.from_numpy(numpy.load(path, allow_pickle=False)))
            elif suffix == ".npz":
                import numpy

                with numpy.load(path, allow_pickle=False) as archive:
                    tensors.extend(
                        _by_name(
                            {key: torch.from_numpy(archive[key]) for key in archive.files}, names
                        )
                    )
            elif suffix == ".pt":
                tensors.extend(_tensors_from_pt(torch.load(path, weights_only=True), path, names))
            else:
                raise InputMismatchError(
                    f"input file {path} has an unknown type '{suffix}'; use .npy, .npz or .pt"
                )
        except InputMismatchError:
            raise
        except Exception as exc:
            raise InputMismatchError(
                f"input file {path} could not be read ({type(exc).__name__}: {exc}); pass a valid {suffix} file"
            ) from None
    return tensors


def _by_name(named: dict, names: Sequence[str]) -> list:
    """The tensors of a named archive, in the package's input order when every key names an input."""
    if names and named and set(named) <= set(names):
        return [named[name] for name in names if name in named]
    return list(named.values())


def _tensors_from_pt(obj: object, path: Path, names: Sequence[str] = ()) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in obj):
        return list(obj)
    if isinstance(obj, dict) and all(isinstance(t, torch.Tensor) for t in obj.values()):
        return _by_name(obj, names)
    raise InputMismatchError(
        f"{path} must hold a tensor, or a list/tuple/dict of tensors, got {type(obj).__name__}"
    )


def flatten_outputs(result: object) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    from torch.utils import _pytree as pytree

    return [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]


def write_outputs(result: object, path: str | os.PathLike, names: Sequence[str] = ()) -> None:
    """All outputs to .npz under their signature names (output_0, ... without names) or to .pt as a
    dict of the same; written atomically."""
    path = Path(path)
    outputs = [t.detach().cpu() for t in flatten_outputs(result)]
    names = (
        list(names) if len(names) == len(outputs) else [f"output_{i}" for i in range(len(outputs))]
    )
    suffix = path.suffix.lower()
    if suffix not in (".npz", ".pt"):
        raise InputMismatchError(f"output file {path} must end in .npz or .pt")
    with replaced_atomically(path) as tmp:
        if suffix == ".npz":
            import numpy

            with open(tmp, "wb") as handle:  # a handle: numpy.savez would append .npz to a name
                numpy.savez(handle, **{name: _to_numpy(t) for name, t in zip(names, outputs)})
        else:
            torch.save(dict(zip(names, outputs)), tmp)


def _to_numpy(tensor: torch.Tensor) -> Any:
    # numpy has no bfloat16: widen it rather than fail.
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()
