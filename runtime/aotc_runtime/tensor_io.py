"""Reading inputs from .npy/.npz/.pt files and writing outputs to .npz/.pt."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from .errors import InputMismatchError
from .files import replaced_atomically
from .npz import expected_inputs, read_npy, read_npz

if TYPE_CHECKING:
    from .signature import Signature


def read_inputs(paths: Sequence[str | os.PathLike], signature: Signature) -> list[torch.Tensor]:
    """The package's inputs, in its order, from .npy, .npz and .pt files.

    Each file fills inputs not filled by an earlier one: an .npy one, the next in order; an .npz
    its entries named after inputs (any order), or arr_0, arr_1, ... the next ones in order; a .pt
    a tensor or a list (the next ones) or a dict keyed by input names. Together the files must give
    every input once. .npy and .npz headers are checked against the signature (dtype, shape, and
    dims shared between inputs) before their data is read (aotc_runtime/npz.py).
    """
    slots = _Slots(signature)
    for number, raw in enumerate(paths):
        path = Path(raw)
        if not path.is_file():
            raise InputMismatchError(
                f"input file {path} does not exist; pass .npy, .npz or .pt files with --input"
            )
        suffix = path.suffix.lower()
        if suffix == ".npy":
            index = slots.next_open(f"input file {path}", 1)
            with _opened(path) as stream:
                slots.fill({index: read_npy(stream, signature, index, slots.bound)})
        elif suffix == ".npz":
            with _opened(path) as stream:
                slots.fill(
                    read_npz(
                        stream,
                        signature,
                        f"input file {path}",
                        inputs=slots.open(),
                        complete=number == len(paths) - 1,
                        bound=slots.bound,
                    )
                )
        elif suffix == ".pt":
            slots.fill(_tensors_from_pt(_load_pt(path), path, slots))
        else:
            raise InputMismatchError(
                f"input file {path} has an unknown type '{suffix}'; use .npy, .npz or .pt"
            )
    return slots.tensors()


class _Slots:
    """The inputs given so far by the --input files, and the dim sizes they set."""

    def __init__(self, signature: Signature):
        self.signature = signature
        self.given: dict[int, torch.Tensor] = {}
        self.bound: dict = {}  # Signature.check_declared's: dims shared between inputs agree

    def open(self) -> list[int]:
        return [i for i in range(len(self.signature.inputs)) if i not in self.given]

    def next_open(self, label: str, count: int) -> int:
        left = self.open()
        if count > len(left):
            raise InputMismatchError(
                f"{label} holds {count} array(s) but {expected_inputs(self.signature, left)}; "
                "pass one array per input"
            )
        return left[0]

    def fill(self, arrays: dict) -> None:
        for index, array in arrays.items():
            self.given[index] = (
                array if isinstance(array, torch.Tensor) else torch.from_numpy(array)
            )

    def tensors(self) -> list[torch.Tensor]:
        missing = [self.signature.inputs[i].name for i in self.open()]
        if missing:
            names = ", ".join(self.signature.input_names)
            raise InputMismatchError(
                f"input(s) {', '.join(missing)} not given by the --input files; the package takes "
                f"{names}"
            )
        return [self.given[i] for i in range(len(self.signature.inputs))]


def _opened(path: Path) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InputMismatchError(
            f"input file {path} could not be opened ({exc.strerror}); check its permissions"
        ) from None


def _load_pt(path: Path) -> object:
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # torch raises several kinds for a damaged or non-tensor file
        first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
        raise InputMismatchError(
            f"input file {path} could not be read ({type(exc).__name__}: {first}); pass a valid "
            ".pt file"
        ) from None


def _tensors_from_pt(obj: object, path: Path, slots: _Slots) -> dict:
    """The inputs a .pt fills: a tensor or list fills the next ones, a dict those it names."""
    if isinstance(obj, torch.Tensor):
        obj = [obj]
    if isinstance(obj, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in obj):
        slots.next_open(f"input file {path}", len(obj))  # refuses more than are left
        return dict(zip(slots.open(), obj))
    if isinstance(obj, dict) and all(isinstance(t, torch.Tensor) for t in obj.values()):
        left = slots.open()
        by_name = {slots.signature.inputs[i].name: i for i in left}
        names = [str(key) for key in obj]
        if not set(names) <= set(by_name):
            raise InputMismatchError(
                f"input file {path} holds tensors named {', '.join(names)}; "
                f"{expected_inputs(slots.signature, left)}: key each tensor by its input's name"
            )
        return {by_name[name]: tensor for name, tensor in zip(names, obj.values())}
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
            from .npz import write_npz

            with open(tmp, "wb") as handle:
                write_npz(handle, {name: _to_numpy(t) for name, t in zip(names, outputs)})
        else:
            torch.save(dict(zip(names, outputs)), tmp)


def _to_numpy(tensor: torch.Tensor) -> Any:
    # numpy has no bfloat16: widen it rather than fail.
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()
