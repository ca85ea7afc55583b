"""GPT-2's `Conv1D` products as the linear layers they are: addmm(bias, x.view(-1, K), weight
[K, N]).view(..., N) rewritten as aten.linear(x, weight', bias), weight' the weight transposed once
at build and stored [N, K]. The passes that work on linear layers then see them: the quantization
of weights (quantization.py, which otherwise keeps a Conv1D's weight in the base precision) and
the fused products (fused_products.py, whose kernel reads weights stored output-major)."""

from __future__ import annotations

import torch

from aotc.export.graph_match import dims, erase_unused, is_view
from aotc.export.graph_match import is_attr as _is_attr
from aotc.export.graph_match import is_call as _is
from aotc.export.graph_match import users as _users

aten = torch.ops.aten


def addmm_as_linear(module) -> int:
    """Rewrite `module`'s (an unlifted GraphModule) Conv1D products in place (the module's doc);
    the reduced-precision clamp and cast on the flattened input move onto x. Only a weight that
    this one product reads; how many were rewritten."""
    graph = module.graph
    readers: dict = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            readers[node.target] = readers.get(node.target, 0) + 1
    rewritten = 0
    for node in list(graph.nodes):
        if not _is(node, aten.addmm.default) or len(node.args) != 3 or node.kwargs:
            continue
        bias, flat, weight = node.args
        if not _is_attr(weight) or readers.get(weight.target) != 1 or _users(weight) != [node]:
            continue
        stored = _parameter(module, weight.target)
        if stored is None or stored.dim() != 2:
            continue
        casts = []  # the clamp and cast between the flattened input and the product, outward
        while (_is(flat, aten.to.dtype) or _is(flat, aten.clamp.default)) and len(
            _users(flat)
        ) == 1:
            casts.append(flat)
            flat = flat.args[0]
        if not is_view(flat):
            continue
        x = flat.args[0]
        users = _users(node)
        value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if value is None or value.dim() < 2 or value.shape[-1] != stored.shape[0]:
            continue
        if len(_users(flat)) != 1 or len(users) != 1:
            continue
        out = users[0]
        out_value = out.meta.get("val")
        if not is_view(out) or out_value is None:
            continue
        if dims(out_value.shape) != dims(value.shape[:-1]) + dims(stored.shape[1:]):
            continue
        with graph.inserting_before(node):
            operand = x
            for cast in reversed(casts):
                operand = graph.call_function(cast.target, (operand, *cast.args[1:]))
            linear = graph.call_function(aten.linear.default, (operand, weight, bias))
        linear.meta = dict(out.meta)
        out.replace_all_uses_with(linear)
        erase_unused(graph, (out, node, *casts, flat))
        owner, _, name = weight.target.rpartition(".")
        holder = module.get_submodule(owner) if owner else module
        setattr(
            holder,
            name,
            torch.nn.Parameter(stored.detach().t().contiguous(), requires_grad=False),
        )
        rewritten += 1
    return rewritten


def _parameter(module, target: str):
    """The module's parameter at `target`, or None (a buffer, or nothing there)."""
    try:
        return module.get_parameter(target)
    except AttributeError:
        return None
