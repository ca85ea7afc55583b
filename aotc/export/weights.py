"""Weights into a constructed model: `--weights FILE` and a model folder's safetensors.

Tensors are copied into the model's own parameters and buffers one at a time, so a model folder's
shards are never all in memory beside the model. A weight the files leave out is accepted only
where the model ties it to one they hold (tie_word_embeddings: save_pretrained writes the
embedding once and leaves lm_head.weight out, as transformers' from_pretrained expects), and a
tensor the model computes itself (a non-persistent buffer such as rotary inv_freq, which older
checkpoints saved) is skipped; any other missing or unexpected name, or a shape that differs, is
refused with the names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aotc.errors import UserInputError
from aotc.export.user_frames import first_line

_SHOWN = 4  # names listed in a message, then "(+N more)"


class WeightsMismatch(Exception):
    """The files' tensors do not fit the model; `str()` is the one-line reason."""


@dataclass
class WeightTargets:
    """The model's tensors by every name they go by, tied names included."""

    tensors: dict = field(default_factory=dict)  # name -> parameter or buffer
    computed: set = field(default_factory=set)  # non-persistent buffers: the model makes them

    @classmethod
    def of(cls, module: Any) -> WeightTargets:
        targets = cls()
        persistent = set(module.state_dict(keep_vars=True))
        for name, tensor in module.named_parameters(remove_duplicate=False):
            targets.tensors[name] = tensor
        for name, tensor in module.named_buffers(remove_duplicate=False):
            if name in persistent:
                targets.tensors[name] = tensor
            else:
                targets.computed.add(name)
        return targets


def copy_weights(module: Any, tensors: Iterable[tuple[str, Callable[[], Any]]]) -> None:
    """Copy (name, read tensor) pairs into `module`; WeightsMismatch if they do not fit it
    exactly (up to tied and computed tensors). A tensor is read only once its name is known to
    be the model's, and converted to the model's dtype as it is copied."""
    import torch

    targets = WeightTargets.of(module)
    loaded: set = set()
    unexpected: list = []
    with torch.no_grad():
        for name, read in tensors:
            target = targets.tensors.get(name)
            if target is None:
                if name not in targets.computed:
                    unexpected.append(name)
                continue
            value = read()
            if tuple(value.shape) != tuple(target.shape):
                raise WeightsMismatch(
                    f"{name} is {list(value.shape)} in the file but {list(target.shape)} in the model"
                )
            target.copy_(value)
            loaded.add(id(target))
    missing_by_tensor: dict = {}  # one name per tensor: a tied pair is one weight missing
    for n, t in targets.tensors.items():
        if id(t) not in loaded:
            missing_by_tensor.setdefault(id(t), n)
    missing = list(missing_by_tensor.values())
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected {_names(unexpected)}")
        raise WeightsMismatch("; ".join(parts))


def _names(names: list) -> str:
    more = f" (+{len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def safetensors_tensors(files: Iterable[Path]) -> Iterator[tuple[str, Callable[[], Any]]]:
    """Every tensor of these safetensors files, read lazily (safetensors reads a JSON header and
    raw bytes: no code runs, and its reader bounds the header's size)."""
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                yield name, (lambda handle=handle, name=name: handle.get_tensor(name))


def load_weights(module: Any, path: Path) -> None:
    """`--weights FILE` (a .safetensors file, or a torch.save state_dict read without unpickling
    code) into the model built from the model file."""
    try:
        pairs: Iterable[tuple[str, Callable[[], Any]]]
        if path.suffix == ".safetensors":
            pairs = safetensors_tensors([path])  # read while copied: the file stays open
        else:
            pairs = [(name, lambda t=t: t) for name, t in _torch_state(path).items()]
        copy_weights(module, pairs)
    except WeightsMismatch as exc:
        raise UserInputError(
            f"--weights {path} does not fit the model: {exc}; pass the state_dict of this "
            "model's class (model.state_dict(), or save_pretrained's model.safetensors)"
        ) from None
    except UserInputError:
        raise
    except Exception as exc:
        raise UserInputError(
            f"--weights {path} could not be read as a state_dict: {first_line(exc)}"
        ) from None


def _torch_state(path: Path) -> dict:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise UserInputError(
            f"--weights {path} is not a state_dict (a mapping of names to tensors); save one "
            "with torch.save(model.state_dict(), PATH) or safetensors"
        )
    return state
