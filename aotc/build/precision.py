"""Place an ExportedProgram on the build device and in the build precision.

fp32 / tf32: the program is moved as is (tf32 is a matmul/conv math mode the runtime switches on).
bf16 / fp16: weights are cast and the model is re-exported inside a wrapper that casts floating
inputs down and floating outputs back up, so the package keeps the signature users exported
(same input and output dtypes) while computing in the reduced precision.
On CUDA the program names an explicit device, cuda:0, wherever it names one (target_device).
"""

from __future__ import annotations

import contextlib
import copy

from aotc.config import Precision

REDUCED = {Precision.BF16: "bfloat16", Precision.FP16: "float16"}


def place_program(ep, device: str, precision: Precision, signature: dict):
    import torch

    target = target_device(device)
    if device != "cpu":
        reshape_instead_of_view(ep)
        # Moved first in every precision: the graph's own device arguments (torch.arange(...,
        # device=x.device), .to(x.device)) were traced as cpu and must name the target too.
        ep = move_program(ep, target)
    if precision not in REDUCED:
        return ep
    low = getattr(torch, REDUCED[precision])
    # ep.module() shares its parameters with `ep`; casting them in place would change the fp32
    # program the numeric check uses as its reference, so cast a copy.
    inner = copy.deepcopy(ep.module()).to(device=target, dtype=low)
    drop_dtype_assertions(inner)
    cast_weight_matmul_operands(inner, low)
    clamp_float_extremes(inner, low)

    n_inputs = len(signature["inputs"])
    n_outputs = len(signature["outputs"])

    class CastWrapper(torch.nn.Module):
        """Computes in reduced precision, keeps the exported float dtypes at the boundary.

        State (a KV cache) is the exception: it comes in and goes out in the reduced dtype, as the
        package stores it (state_in_precision), so a decode step neither converts the whole cache
        nor keeps it at twice the memory."""

        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args):
            cast = [a.to(low) if a.is_floating_point() else a for a in args[:n_inputs]]
            flat = self.module(*cast, *args[n_inputs:])
            if not isinstance(flat, (tuple, list)):
                return flat.float() if flat.is_floating_point() else flat
            outputs = [t.float() if t.is_floating_point() else t for t in flat[:n_outputs]]
            return (*outputs, *flat[n_outputs:])

    example = [t.to(target) for t in ep.example_inputs[0]]
    example = example[:n_inputs] + state_in_precision(example[n_inputs:], precision)
    try:
        return torch.export.export(
            CastWrapper(inner),
            tuple(example),
            dynamic_shapes=dynamic_shapes(signature),
            strict=False,
        )
    except Exception as exc:
        from aotc.errors import BuildError
        from aotc.export.user_frames import first_line

        raise BuildError(
            f"the program cannot run in {precision.value} ({type(exc).__name__}: {first_line(exc)[:200]}); "
            "build it in fp32 (or tf32 on CUDA)"
        ) from exc


def weights_rounded_to(ep, precision: Precision):
    """A copy of the fp32 program `ep` whose weights hold what a `precision` package holds (each
    rounded to it and back): the numeric check's reference for a bf16/fp16 build, so that what it
    measures is the package's arithmetic, not that its weights were stored in fewer bits (eager
    in bf16 has those same weights)."""
    if precision not in REDUCED:
        return ep
    import torch

    low = getattr(torch, REDUCED[precision])
    ep = copy.deepcopy(ep)
    with torch.no_grad():
        for tensor in [*ep.state_dict.values(), *ep.constants.values()]:
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                tensor.copy_(tensor.to(low).to(tensor.dtype))
    return ep


def state_in_precision(state: list, precision: Precision) -> list:
    """The state tensors a package of `precision` carries: floating ones in the reduced dtype."""
    if precision not in REDUCED:
        return list(state)
    import torch

    low = getattr(torch, REDUCED[precision])
    return [t.to(low) if t.is_floating_point() else t for t in state]


def signature_in_precision(signature: dict, precision: Precision) -> dict:
    """`signature` as a package of `precision` declares it: inputs and outputs keep the exported
    dtypes (CastWrapper), floating state is stored in the reduced dtype."""
    if precision not in REDUCED or not signature.get("state"):
        return signature
    floating = {"float32", "float64", "float16", "bfloat16"}
    state = [
        {**spec, "dtype": REDUCED[precision]} if spec["dtype"] in floating else spec
        for spec in signature["state"]
    ]
    return {**signature, "state": state}


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
    float != c10::BFloat16" (issue 25). Casting at the product, as torch.autocast does for
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
    without overflow", issue 25's t5-small). Eager bf16 uses torch.finfo(bfloat16).min there:
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


def target_device(device: str):
    """The torch.device a build for `device` ("cpu" or "cuda") places its program on: CUDA with an index.

    A bare "cuda" written into the graph breaks on the GPU: tensors live on cuda:0, and
    torch.device("cuda") != torch.device("cuda:0"), so GPT-2's `.to(...)` check
    `aten._assert_tensor_metadata(embedding_1, device=cuda)` fails with "Expected: cuda, Got: cuda:0".
    Index 0 because the runtime loads CUDA packages on cuda:0 (aotc_runtime/package.py) and the
    numeric check and bench run there too.
    """
    import torch

    return torch.device("cuda", 0) if device == "cuda" else torch.device(device)


def move_program(ep, target):
    """Move `ep` (weights, constants, example inputs, graph) to `target`, an indexed torch.device.

    torch's move_to_device_pass writes str(target) ("cuda:0") into `device=` kwargs and
    aten.to.device; name_graph_devices then covers whatever it leaves (a device-typed positional
    argument of another op) and writes torch.device objects, as torch.export traced them.
    """
    from torch.export.passes import move_to_device_pass

    ep = move_to_device_pass(ep, target)
    name_graph_devices(ep.graph_module, target)
    ep.graph_module.recompile()
    return ep


def name_graph_devices(graph_module, target) -> int:
    """Set every device argument of every op in the graph (and its subgraphs) to `target`, in place.

    Device arguments are found by the op's schema (Device or Device? arguments, positional or
    keyword), and by the name `device=` where an op has no schema. Returns how many changed.
    """
    import torch

    changed = 0
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function":
                continue
            positions, names = _device_arguments(node.target)
            args, kwargs = list(node.args), dict(node.kwargs)
            slots = [(args, i) for i in positions if i < len(args)] + [
                (kwargs, k) for k in names if k in kwargs
            ]
            for container, key in slots:
                if _is_device_value(container[key]):
                    changed += torch.device(container[key]) != target
                    container[key] = target
            node.args, node.kwargs = tuple(args), kwargs
    return changed


def _device_arguments(target) -> tuple:
    """(positions, names) of an op's device-typed arguments; ((), {"device"}) for a target with no schema."""
    import torch

    schema = getattr(target, "_schema", None)
    if schema is None:
        return (), {"device"}
    positions, names = set(), set()
    for i, arg in enumerate(schema.arguments):
        kind = arg.type.getElementType() if isinstance(arg.type, torch.OptionalType) else arg.type
        if isinstance(kind, torch.DeviceObjType):
            names.add(arg.name)
            if not arg.kwarg_only:
                positions.add(i)
    return positions, names


def _is_device_value(value) -> bool:
    """A torch.device or a device string ("cuda", "cuda:0", "cpu"); None (no device given) is left alone."""
    import torch

    if isinstance(value, torch.device):
        return True
    if isinstance(value, str):
        try:
            torch.device(value)
        except RuntimeError:
            return False
        return True
    return False


def reshape_instead_of_view(ep) -> None:
    """Turn the graph's aten.view calls into aten.reshape, in place, before it moves to another device.

    An artifact is exported on the CPU, and the strides of an op's output can differ by device. When
    the CPU output was already contiguous, `.contiguous()` traced to nothing, and the graph holds a
    bare `view` that the CUDA strides do not allow: torchvision's vit_b_16 (nn.MultiheadAttention
    after efficient attention) fails in AOTInductor with "Cannot view a tensor with shape ...".
    `reshape` is a view wherever a view is possible and copies only where `view` would raise, so
    the graph means the same everywhere it worked before, and lowering on the device decides.
    """
    import torch

    changed = False
    for node in ep.graph_module.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
            changed = True
    if changed:
        ep.graph_module.recompile()


def dynamic_shapes(signature: dict):
    """The artifact's dynamic_shapes again, from its signature (state inputs are static)."""
    from aotc.export.shapes import DimSpec, export_dynamic_shapes

    dims = {
        name: DimSpec(name, info["min"], info["max"])
        for name, info in (signature.get("dims") or {}).items()
    }
    shapes = [spec["shape"] for spec in signature["inputs"]]
    return export_dynamic_shapes(shapes, dims, extra_static=len(signature.get("state", ())))


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """TF32 for CUDA matmuls and cuDNN convolutions while inside (a tf32 build, or baselines of one)."""
    with _tf32_flags(True if enabled else None):
        yield


@contextlib.contextmanager
def strict_fp32():
    """No TF32 anywhere while inside: the build's fp32 numeric check on CUDA.

    cuDNN runs fp32 convolutions in TF32 by default; eager and the package then pick different
    kernels (Inductor often switches convs to channels-last), and their TF32 rounding differs by
    ~1e-3 of the output's scale, which deep nets push past any fp32 tolerance (resnet50: max abs
    0.02 on the H100). With TF32 off on both sides, what is left is what the check is for: the
    compiler's own differences (resnet50 then passes at 2e-3).
    """
    with _tf32_flags(False):
        yield


@contextlib.contextmanager
def _tf32_flags(value: bool | None):
    """Set both TF32 switches to `value` while inside (None: leave them), then restore them."""
    import torch

    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if value is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = value
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
