"""Small questions the graph passes ask of an FX node (fused_products.py, linear_products.py)."""

from __future__ import annotations

import torch


def is_call(node, target) -> bool:
    """Whether `node` is a call of `target`."""
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


def is_attr(node) -> bool:
    """Whether `node` reads a module attribute (a weight, a buffer)."""
    return isinstance(node, torch.fx.Node) and node.op == "get_attr"


def users(node) -> list:
    """The node's users, less the dtype assertions export adds after a `.to()` (they check the
    traced dtype of a value a rewritten graph no longer materializes, and go with it)."""
    check = torch.ops.aten._assert_tensor_metadata.default
    return [u for u in node.users if not is_call(u, check)]


def is_view(node) -> bool:
    """Whether `node` is a view or reshape (the same values, laid out again)."""
    aten = torch.ops.aten
    return is_call(node, aten.view.default) or is_call(node, aten.reshape.default)


def dims(shape) -> list[str]:
    """A traced shape's sizes as text, so that symbolic sizes compare without guarding on them."""
    return [str(d) for d in shape]


def erase_unused(graph, nodes) -> None:
    """Erase each of `nodes` (users before what they use) that nothing reads any more, with the
    dtype assertions that were its only readers."""
    for node in nodes:
        if not users(node):
            for check in list(node.users):
                graph.erase_node(check)
            graph.erase_node(node)
