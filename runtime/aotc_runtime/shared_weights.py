"""One copy of the weights for a package and its specialized members (manifest `shared_weights`).

`aotc build --specialize` compiles the model once per size; each compiled program would carry its
own copy of the weights (BERT-base with three sizes: 1.76 GB for 439 MB of weights). Instead the
build writes the weights once to a file of plain tensors and the programs carry none; here each
program is pointed at those tensors with AOTInductor's user-managed constants, so they are in
memory once too (`load_constants(..., user_managed=True)` keeps the caller's tensors, no copy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .errors import PackageError
from .manifest import Manifest

OVERRIDE = "::"  # "FOLDER::NAME": a program's own value of NAME, where it differs from the others'


def read_shared_weights(path: Path, manifest: Manifest, device: torch.device) -> dict:
    """The weights file's tensors on `device` (read with weights_only: nothing in it runs)."""
    shared = manifest.shared_weights
    assert shared is not None
    try:
        weights = torch.load(path / shared.file, weights_only=True, map_location="cpu", mmap=True)
    except Exception as exc:
        raise PackageError(
            f"package {path}: its {shared.file} could not be read ({type(exc).__name__}); rebuild "
            "it with `aotc build --force`"
        ) from None
    if not isinstance(weights, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
    ):
        raise PackageError(
            f"package {path}: its {shared.file} is not a map of names to tensors; rebuild it"
        )
    for name, tensor in weights.items():
        # a compiled program reads its constants as dense arrays: a view that claims more
        # elements than its storage holds (an expanded tensor) would be read past its end
        if (
            not tensor.is_contiguous()
            or tensor.untyped_storage().nbytes()
            < (tensor.storage_offset() + tensor.numel()) * tensor.element_size()
        ):
            raise PackageError(
                f"package {path}: {shared.file} holds {name} as a view, not a whole tensor; rebuild it"
            )
    return {name: tensor.to(device) for name, tensor in weights.items()}


def point_at_weights(loader: Any, weights: dict, program: str, path: Path) -> None:
    """Give the compiled program `program` ("." or a member folder) its constants from `weights`."""
    constants = {}
    for name in loader.get_constant_fqns():
        tensor = weights.get(f"{program}{OVERRIDE}{name}", weights.get(name))
        if tensor is None:
            raise PackageError(
                f"package {path}: its shared weights hold no {name!r} for {program}; rebuild it "
                "with `aotc build --force`"
            )
        constants[name] = tensor
    try:
        loader.load_constants(constants, False, True, True)
    except Exception as exc:  # the C++ side names what it refused
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PackageError(
            f"package {path}: {program} refused its shared weights ({first}); rebuild it"
        ) from None
