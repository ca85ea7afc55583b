"""The signature an artifact records: inputs (names, dtypes, shapes with dim names, value ranges),
outputs (names from the model's output structure, shapes as expressions of the dims), state.

Its JSON form is the `signature` of docs/package-format.md; the runtime reads it as
aotc_runtime.Signature.
"""

from __future__ import annotations

from aotc.export.call_structure import OutputLayout
from aotc.export.example_call import ExampleCall


def _symbol_names(ep, shapes) -> dict:
    """sympy symbol of each dynamic input axis -> the user's dim name."""
    names = {}
    placeholders = [
        n
        for n in ep.graph.nodes
        if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs
    ]
    for node, shape in zip(placeholders, shapes):
        value = node.meta.get("val")
        for axis, entry in enumerate(shape):
            if isinstance(entry, str) and value is not None and hasattr(value.shape[axis], "node"):
                names[str(value.shape[axis].node.expr)] = entry
    return names


def _dim_text(size, names: dict):
    if isinstance(size, int):
        return size
    text = str(size.node.expr) if hasattr(size, "node") else str(size)
    for symbol, name in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(symbol, name)
    return text


# Ops an index tensor may pass through on its way to an embedding lookup (GPT-2 views its ids first).
_INDEX_PASSTHROUGH = (
    "view",
    "reshape",
    "_unsafe_view",
    "unsqueeze",
    "squeeze",
    "flatten",
    "clone",
    "contiguous",
    "expand",
    "alias",
)


def _embedding_rows(node) -> int | None:
    """Rows of the embedding table an integer input indexes (through views), or None."""
    import torch

    frontier, seen = [node], set()
    while frontier:
        current = frontier.pop()
        if current in seen:
            continue
        seen.add(current)
        for user in current.users:
            target = getattr(user, "target", None)
            if (
                target is torch.ops.aten.embedding.default
                and len(user.args) > 1
                and user.args[1] is current
            ):
                weight = user.args[0].meta.get("val") if hasattr(user.args[0], "meta") else None
                if weight is not None and isinstance(weight.shape[0], int):
                    return int(weight.shape[0])
            name = getattr(target, "__name__", "")
            if (
                user.op == "call_function"
                and name.split(".")[0] in _INDEX_PASSTHROUGH
                and user.args
                and user.args[0] is current
            ):
                frontier.append(user)
    return None


def _value_range(node, tensor) -> list | None:
    """[low, high] random integer inputs are drawn from: an embedding's rows, else the example's range."""
    import torch

    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool or not tensor.numel():
        return None
    rows = _embedding_rows(node) if node is not None else None
    if rows is not None:
        return [0, rows - 1]
    return [int(tensor.min()), int(tensor.max())]


def make_signature(ep, call: ExampleCall, layout: OutputLayout, state: list) -> dict:
    from aotc_runtime import DTYPE_NAMES

    names = _symbol_names(ep, call.shapes)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user_nodes = [placeholders.get(name) for name in ep.graph_signature.user_inputs]
    spec_inputs = []
    for index, (name, tensor, shape) in enumerate(zip(call.names, call.tensors, call.shapes)):
        spec_inputs.append(
            {
                "name": name,
                "dtype": DTYPE_NAMES[tensor.dtype],
                "shape": list(shape),
                "value_range": _value_range(user_nodes[index], tensor),
                "keyword": index >= call.n_positional,
            }
        )
    output_node = next(n for n in ep.graph.nodes if n.op == "output")
    values = [
        node.meta.get("val") if hasattr(node, "meta") else None for node in output_node.args[0]
    ]
    outputs = [
        {
            "name": name,
            "dtype": DTYPE_NAMES.get(value.dtype, str(value.dtype)),
            "shape": [_dim_text(s, names) for s in value.shape],
        }
        for name, value in zip(layout.names, values)
    ]
    signature = {
        "inputs": spec_inputs,
        "outputs": outputs,
        "dims": {n: d.to_dict() for n, d in call.dims.items()},
        "output_structure": layout.structure,
    }
    if layout.dropped:
        signature["dropped_outputs"] = list(layout.dropped)
    if call.constants:
        signature["constants"] = dict(call.constants)
    if state:
        signature["state"] = [
            {"name": name, "dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape)}
            for name, t in state
        ]
        # the program writes the state's new values into its state inputs (call_structure.py);
        # packages from before this field return them after the outputs instead
        signature["state_in_place"] = True
    return signature
