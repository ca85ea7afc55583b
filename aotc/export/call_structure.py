"""How a model is called and what it returns, made flat so the artifact never needs the user's classes.

Models are called with positional and keyword tensors (`model(input_ids=..., attention_mask=...)`)
and return tensors, tuples, dicts, named tuples or dataclasses (transformers' ModelOutput). torch.export
records the output's Python type in the artifact's call spec, so an artifact exported from a model
returning a ModelOutput cannot be loaded where transformers is not imported. aotc therefore exports
`FlatCall`, a wrapper whose forward takes one flat tuple of tensors and returns one flat tuple of
tensors; the structure (input names, which are keywords, output names from their paths in the
returned structure) is recorded in aotc's signature, and the runtime rebuilds what users expect
from it (docs/usage.md).

State: buffers that `forward` mutates (counters, caches) are lifted out of the program. The package
takes their current values as extra inputs and returns their new values as extra outputs; the
runtime keeps them between calls, as eager does. Inductor's ahead-of-time packages otherwise bake a
buffer's value in as a constant and return the same result on every call (torch 2.13, seen with a
counter buffer: 1, 1, 1 where eager gives 1, 2, 3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from aotc.errors import ModelError

TENSOR, TUPLE, LIST, DICT = "tensor", "tuple", "list", "dict"
CONSTANT_TYPES = (bool, int, float, str, type(None))


@dataclasses.dataclass(frozen=True)
class OutputLayout:
    """Names of the tensor leaves of a model's output, in flattening order, and the form to rebuild."""

    structure: str  # TENSOR (one tensor), TUPLE / LIST (a flat sequence of tensors), DICT (anything else, by name)
    names: tuple
    dropped: tuple = ()  # paths of None entries, left out of the package's outputs


def _is_namedtuple(value) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _children(value):
    """[(key, child)] of a container the flattening walks into; None for anything else."""
    if isinstance(
        value, Mapping
    ):  # dict, OrderedDict, transformers' ModelOutput (its items() skip None fields)
        return [(str(k), v) for k, v in value.items()]
    if _is_namedtuple(value):
        return [(name, getattr(value, name)) for name in value._fields]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    if isinstance(value, (tuple, list)):
        return [(str(i), v) for i, v in enumerate(value)]
    return None


def _walk(value, path: tuple, leaves: list, dropped: list, other: list) -> None:
    """Sort the output's leaves by path: tensors, None entries, and anything else."""
    import torch

    if isinstance(value, torch.Tensor):
        leaves.append((path, value))
        return
    if value is None:
        dropped.append(path)
        return
    children = _children(value)
    if children is None:
        other.append((path, value))
        return
    for key, child in children:
        _walk(child, path + (key,), leaves, dropped, other)


def flat_leaves(output) -> list:
    """The output's tensors in the order the layout names them (None entries skipped)."""
    leaves: list = []
    _walk(output, (), leaves, [], [])
    return [tensor for _path, tensor in leaves]


def output_layout(output) -> OutputLayout:
    """Read the structure of one eager output; raise ModelError for a non-tensor leaf."""
    import torch

    leaves: list = []
    dropped: list = []
    other: list = []
    _walk(output, (), leaves, dropped, other)
    top_sequence = isinstance(output, (tuple, list)) and not _is_namedtuple(output)

    def name(
        path,
    ):  # a plain tuple's top level reads output_0, output_1, as the outputs of a flat tuple do
        head = f"output_{path[0]}" if top_sequence else path[0]
        return ".".join((head,) + path[1:])

    if other:
        path, value = other[0]
        kind = type(value).__name__
        fix = (
            # transformers' KV cache: the model generates; its loop is aotc's to run
            "a decoder LM is exported for generation with `--task text-generation --max-seq-len N`"
            if kind.endswith("Cache")
            else "return it as a tensor (torch.tensor(value)) or leave it out of forward's result"
        )
        raise ModelError(
            f"model output {name(path) if path else ''} is a {kind} ({str(value)[:40]!r}), not a "
            f"tensor; packages return tensors only: {fix}"
        )
    if not leaves:
        raise ModelError(
            "the model returns no tensors; forward must return a tensor or a structure of tensors"
        )
    if isinstance(output, torch.Tensor):
        return OutputLayout(TENSOR, ("output_0",))
    if top_sequence and all(len(p) == 1 for p, _ in leaves):
        return OutputLayout(
            LIST if isinstance(output, list) else TUPLE,
            tuple(name(p) for p, _ in leaves),
            tuple(name(p) for p in dropped),
        )
    return OutputLayout(
        DICT, _unique([name(p) for p, _ in leaves]), tuple(name(p) for p in dropped)
    )


def _unique(names: list) -> tuple:
    seen: dict = {}
    result = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        result.append(name if count == 0 else f"{name}_{count}")
    return tuple(result)


def call_model(model, flat, n_positional: int, keywords: tuple, constants: dict):
    """model(*positional, **keywords, **constants) from one flat tuple of tensors."""
    args = flat[:n_positional]
    kwargs = dict(zip(keywords, flat[n_positional : n_positional + len(keywords)]))
    kwargs.update(constants)
    return model(*args, **kwargs)


def initial_state(ep, signature: dict, device="cpu") -> list:
    """The state's values at export: an exported FlatCall's example inputs are the model's inputs,
    then the state (make_flat_call); copies, so running from them (the program updates them in
    place) never changes the artifact."""
    n_inputs = len(signature["inputs"])
    return (
        [t.to(device).clone() for t in list(ep.example_inputs[0])[n_inputs:]]
        if signature.get("state")
        else []
    )


def make_flat_call(
    model, n_positional: int, keywords: tuple, constants: dict, single: bool, state: tuple = ()
):
    """The module aotc exports: forward(*flat tensors) -> a tensor or a flat tuple of tensors.

    `state`: FQNs of buffers forward mutates. Their values come in after the inputs and the program
    updates those inputs in place (torch.export records them as mutated user inputs, and
    AOTInductor writes into the caller's tensors): the program holds no state, and a step of a KV
    cache writes the new positions only, where returning the new state would copy the whole cache
    at every call.
    """
    import torch
    from torch.nn.utils.stateless import _reparametrize_module

    class FlatCall(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *flat):
            n_inputs = n_positional + len(keywords)
            if not state:
                out = flat_leaves(call_model(self.model, flat, n_positional, keywords, constants))
                return out[0] if single else tuple(out)
            given = dict(zip(state, flat[n_inputs:]))
            # torch.func.functional_call's mechanism, used directly so that forward's in-place
            # updates land on the inputs, and a buffer forward rebinds can be read back
            with _reparametrize_module(self.model, given):
                out = flat_leaves(call_model(self.model, flat, n_positional, keywords, constants))
                for name, value in given.items():
                    now = self.model.get_buffer(name)
                    if now is not value:  # rebound, not mutated: its new value goes into the input
                        value.copy_(now)
            return out[0] if single else tuple(out)

    return FlatCall()
