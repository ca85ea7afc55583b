"""The graph passes that let a program traced in fp32 run in bf16 or fp16 (placement.place_program
applies them to the copy it casts): dtype assertions dropped, matmul operands cast to the weights'
dtype, float extremes clamped to what the reduced dtype holds."""

from __future__ import annotations


def drop_dtype_assertions(module) -> None:
    """Remove `aten._assert_tensor_metadata` checks from a graph about to run in another precision.

    `.to(...)` calls trace to an assertion of the dtype seen at export (GPT-2: float32); casting the
    program to bf16 makes those assertions false by design, not the program wrong.
    """
    import torch

    for graph_module in module.modules():
        graph = getattr(graph_module, "graph", None)
        if graph is None or not hasattr(graph_module, "recompile"):
            continue
        doomed = [
            n
            for n in graph.nodes
            if n.op == "call_function"
            and n.target is torch.ops.aten._assert_tensor_metadata.default
        ]
        for node in doomed:
            graph.erase_node(node)
        if doomed:
            graph_module.recompile()


# Matrix products whose operands must share a dtype (eager refuses float x bfloat16).
_MATMULS = ("linear", "mm", "addmm", "bmm", "baddbmm", "matmul", "addmv", "mv")
# Ops that only look at a weight differently (transposed, reshaped): a weight is still a weight.
_VIEWS = (
    "t",
    "permute",
    "transpose",
    "view",
    "reshape",
    "expand",
    "unsqueeze",
    "alias",
    "_to_copy",
)


def cast_weight_matmul_operands(module, low) -> None:
    """Cast the other operand of every matrix product with a weight to the weight's dtype, and
    attention's query, key, value and float mask to the reduced dtype.

    A program traced in fp32 holds the model's deliberate float32 computations (Llama's RMSNorm
    and rotary embedding upcast with `.to(torch.float32)`); eager in bf16 casts back with
    `.to(input_dtype)`, but that cast was traced as a no-op (fp32 to fp32) and is gone. So the
    float32 result meets a bf16 weight: "expected mat1 and mat2 to have the same dtype, but got:
    float != c10::BFloat16". Casting at the product, as torch.autocast does for
    matmuls, keeps the upcast computations in float32 and runs the products in the weight's dtype,
    which is what eager bf16 does.
    """
    import torch

    aten = torch.ops.aten
    matmuls = {getattr(aten, name).default for name in _MATMULS if hasattr(aten, name)}
    attentions = {aten.scaled_dot_product_attention.default}
    for graph_module in module.modules():
        graph = getattr(graph_module, "graph", None)
        if graph is None or not hasattr(graph_module, "recompile"):
            continue
        weights = {name for name, _ in graph_module.named_parameters()}
        changed = False
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target in attentions:
                # eager bf16 attends in bf16: query, key, value and a float mask all come from
                # bf16 projections or from masks built with the activations' dtype
                for arg in node.args[:4]:
                    if isinstance(arg, torch.fx.Node) and _is_floating(arg):
                        _cast_input(graph, node, arg, low)
                        changed = True
                continue
            if node.op != "call_function" or node.target not in matmuls:
                continue
            operands = [a for a in node.args if isinstance(a, torch.fx.Node)]
            if not any(_is_weight(a, weights) for a in operands):
                continue
            for arg in operands:
                if _is_weight(arg, weights):
                    continue
                _cast_input(graph, node, arg, low)
                changed = True
        if changed:
            graph_module.recompile()


def _cast_input(graph, node, arg, low) -> None:
    """`node` reads `arg` cast to `low`, clamped to `low`'s finite range first: an attention mask
    traced in fp32 holds torch.finfo(float32).min, which rounds to -inf in bf16, and a query
    whose keys are all masked (a left-padded prompt's padding) then softmaxes -inf against -inf
    into NaN, which spreads through the values into the real tokens' attention. Eager bf16
    builds its mask with torch.finfo(bfloat16).min, which this clamp gives."""
    import torch

    finfo = torch.finfo(low)
    with graph.inserting_before(node):
        inside = arg
        if _is_float32_or_wider(arg):
            inside = graph.call_function(torch.ops.aten.clamp.default, (arg, finfo.min, finfo.max))
        cast = graph.call_function(torch.ops.aten.to.dtype, (inside, low))
    node.replace_input_with(arg, cast)


def _is_float32_or_wider(node) -> bool:
    import torch

    value = node.meta.get("val")
    return value is None or getattr(value, "dtype", None) in (torch.float32, torch.float64)


def clamp_float_extremes(module, low) -> None:
    """Clamp the float constants of a graph about to compute in `low` to `low`'s finite range.

    A model traced in fp32 writes torch.finfo(float32).min into its graph as a number (T5's
    masks: `masked_fill(mask, finfo.min)`, `full(..., finfo.min)`); in a bf16 graph that number
    is a bf16 value, and Inductor refuses it ("value cannot be converted to type c10::BFloat16
    without overflow" in t5-small). Eager bf16 uses torch.finfo(bfloat16).min there:
    the nearest finite value, which is what the clamp writes. Infinities are left as they are.
    """
    import math

    import torch

    top = torch.finfo(low).max

    def clamped(value):
        if isinstance(value, float) and math.isfinite(value) and abs(value) > top:
            return math.copysign(top, value)
        return value

    for graph_module in module.modules():
        graph = getattr(graph_module, "graph", None)
        if graph is None or not hasattr(graph_module, "recompile"):
            continue
        changed = False
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            args = tuple(clamped(a) for a in node.args)
            kwargs = {k: clamped(v) for k, v in node.kwargs.items()}
            if args != node.args or kwargs != node.kwargs:
                node.args, node.kwargs = args, kwargs
                changed = True
        if changed:
            graph_module.recompile()


def _is_floating(node) -> bool:
    value = node.meta.get("val")
    return value is None or getattr(value, "is_floating_point", lambda: False)()


def _is_weight(node, weights: set) -> bool:
    """Whether `node` is a parameter, seen through views (t, permute, reshape...)."""
    while (
        node.op == "call_function" and getattr(node.target, "__name__", "").split(".")[0] in _VIEWS
    ):
        node = node.args[0]
    return node.op == "get_attr" and node.target in weights
