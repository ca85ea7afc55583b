"""Linear layers that read the same input, computed as one matrix multiply (a decode step's GEMVs).

A decode step multiplies one token's activations by every weight matrix once, and on a GPU a
matrix-vector product of a small matrix cannot reach the memory bandwidth a large one does: on the
H100 the Llama-3.2-1B shape's key and value projections (2 MB each) took 5.3 µs, 0.4 TB/s, and the
query projection 5.9 µs, against 2.1-2.9 TB/s for the 32-525 MB ones (docs/benchmarks.md). Attention
layers project one input three times (query, key, value) and gated MLPs twice (gate, up): those
siblings stacked into one weight are one product of the summed size, the way vLLM's model code
writes them (QKVParallelLinear, MergedColumnParallelLinear), done here for any model as written.

`fuse_sibling_linears` finds the siblings by running the model once and recording which
`nn.Linear`s are called on the same tensor object, then gives each group one concatenated weight,
held by a `StackedLinear` registered as `stacked__<a>__<b>...` beside the first member, and replaces
the members by `StackedMember`s. The first member called computes the product for the whole group;
the others take their slice of it when called on the same input, and compute their own rows of the
stacked weight otherwise, so any call order gives each member its own result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

PREFIX = "stacked__"  # a stacked weight's module name: PREFIX + the members' names joined by "__"


class StackedLinear(torch.nn.Module):
    """The stacked weight [sum of out_features, in_features] (and bias) of sibling linears."""

    def __init__(self, members: list):
        super().__init__()
        self.sizes = [m.out_features for m in members]
        self.weight = torch.nn.Parameter(
            torch.cat([m.weight.detach() for m in members]), requires_grad=False
        )
        biased = members[0].bias is not None
        self.bias = (
            torch.nn.Parameter(torch.cat([m.bias.detach() for m in members]), requires_grad=False)
            if biased
            else None
        )
        self._input: Any = None  # the input of the product in self._outputs
        self._outputs: list = []

    def member_output(self, index: int, x: Any) -> Any:
        if self._input is not x or self._outputs[index] is None:
            out = torch.nn.functional.linear(x, self.weight, self.bias)
            self._input, self._outputs = x, list(out.split(self.sizes, dim=-1))
        y, self._outputs[index] = self._outputs[index], None
        if all(o is None for o in self._outputs):
            self._input = None  # every member took its slice: hold no tensor past the step
        return y


class StackedMember(torch.nn.Module):
    """One member of a stack: its output is its slice of the stacked product."""

    def __init__(self, stack: StackedLinear, index: int, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._index = index
        self._stack = [stack]  # in a list: not a submodule, so the weight has one name only

    def forward(self, x):
        return self._stack[0].member_output(self._index, x)


def sibling_groups(model: Any, run_once: Callable[[], Any]) -> list[list[str]]:
    """[[module name, ...]] of linears `run_once()` calls on one tensor object, each called once,
    with the same input size, dtype and bias or none, and weights no other module shares."""
    linears = {n: m for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    owners: dict[int, int] = defaultdict(int)  # parameter id -> modules holding it (tied weights)
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners[id(p)] += 1
    calls: list = []
    hooks = [
        m.register_forward_pre_hook(lambda _m, args, name=name: calls.append((args[0], name)))
        for name, m in linears.items()
    ]
    try:
        run_once()
    finally:
        for hook in hooks:
            hook.remove()
    called: dict[str, int] = defaultdict(int)
    by_input: dict[int, list] = defaultdict(list)
    for x, name in calls:
        called[name] += 1
        by_input[id(x)].append(name)
    groups = []
    for names in by_input.values():
        names = [n for n in dict.fromkeys(names) if called[n] == 1]
        members = [linears[n] for n in names]
        if len(members) < 2 or any(owners[id(p)] > 1 for m in members for p in m.parameters()):
            continue
        first = members[0]
        if all(
            m.in_features == first.in_features
            and m.weight.dtype == first.weight.dtype
            and (m.bias is None) == (first.bias is None)
            for m in members
        ):
            groups.append(names)
    return groups


def fuse_sibling_linears(model: Any, run_once: Callable[[], Any]) -> int:
    """Stack every group `sibling_groups` finds (see above); the number of groups stacked."""
    groups = sibling_groups(model, run_once)
    for names in groups:
        members = [model.get_submodule(n) for n in names]
        stack = StackedLinear(members)
        parent_name, _, _ = names[0].rpartition(".")
        parent = model.get_submodule(parent_name)
        leaves = [n.rpartition(".")[2] for n in names]
        parent.add_module(PREFIX + "__".join(leaves), stack)
        for index, (name, member) in enumerate(zip(names, members)):
            owner_name, _, leaf = name.rpartition(".")
            replacement = StackedMember(stack, index, member.in_features, member.out_features)
            setattr(model.get_submodule(owner_name), leaf, replacement)
    return len(groups)


def unstacked(weights: dict, sizes_of: Callable[[str], int]) -> dict:
    """`weights` by name with each stacked weight split back into its members' weights (the
    names a model without stacks has): sizes_of(member weight name) -> its rows."""
    out = {}
    for name, tensor in weights.items():
        module, _, kind = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        if not leaf.startswith(PREFIX):
            out[name] = tensor
            continue
        members = leaf[len(PREFIX) :].split("__")
        names = [f"{parent}.{m}.{kind}" if parent else f"{m}.{kind}" for m in members]
        for member, part in zip(names, tensor.split([sizes_of(n) for n in names])):
            out[member] = part
    return out
