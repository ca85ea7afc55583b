"""Place an ExportedProgram on a device and in a precision: the build's program, the numeric
check's eager reference, and `aotc bench`'s baselines are all placed here, so they compute alike.

fp32 / tf32: the program is moved as is (tf32 is a matmul/conv math mode the runtime switches on).
bf16 / fp16: weights are cast and the model is re-exported inside a wrapper that casts floating
inputs down and floating outputs back up, so the package keeps the signature users exported
(same input and output dtypes) while computing in the reduced precision (the graph passes that
make an fp32 trace run so are reduced_precision.py).
On CUDA the program names an explicit device, cuda:0, wherever it names one (target_device).
"""

from __future__ import annotations

import copy
import dataclasses

from aotc.config import Precision
from aotc.errors import BuildError
from aotc.export.fused_products import Fusions, fuse_products
from aotc.export.gptq import step_calls
from aotc.export.linear_products import addmm_as_linear
from aotc.export.quantization import linear_inputs, quantize_graph
from aotc.export.reduced_precision import (
    cast_weight_matmul_operands,
    clamp_float_extremes,
    drop_dtype_assertions,
)
from aotc.export.shapes import signature_dynamic_shapes
from aotc.export.user_frames import first_line
from aotc.math_mode import REDUCED
from aotc.quantize_schemes import Quantization


def place_program(
    ep,
    device: str,
    precision: Precision,
    signature: dict,
    quantization: Quantization | None = None,
    emulate: Precision | None = None,
    fusions: Fusions | None = None,
):
    """`ep` on `device` in `precision`, its linear weights quantized as `quantization` asks (filled
    in with what was done). `emulate`: build the numeric check's fp32 reference for a quantized
    package of that precision instead: the same quantized weights, dequantized in fp32.
    `fusions`: fuse the products with their neighbours (fused_products.py), counted there."""
    import torch

    target = target_device(device)
    if device != "cpu":
        reshape_instead_of_view(ep)
        # Moved first in every precision: the graph's own device arguments (torch.arange(...,
        # device=x.device), .to(x.device)) were traced as cpu and must name the target too.
        ep = move_program(ep, target)
    if precision not in REDUCED and quantization is None and fusions is None:
        return ep
    low = getattr(torch, REDUCED[precision]) if precision in REDUCED else torch.float32
    n_inputs = len(signature["inputs"])
    n_outputs = len(signature["outputs"])
    example = [t.to(target) for t in ep.example_inputs[0]]
    calibration: dict = {}
    if quantization is not None and emulate is None:  # the reference does not measure again
        calibration = linear_inputs(ep.module(), example)
    chosen_by = None  # a calibrated method's float program and its calls (gptq.py)
    if quantization is not None and quantization.method == "gptq" and not quantization.calibrated:
        # the package's build, or `aotc verify`'s reference, which chooses the levels again
        chosen_by = (ep.module(), step_calls(signature, example, quantization.calibration_chunks))
    example = example[:n_inputs] + state_in_precision(example[n_inputs:], precision)
    # ep.module() shares its parameters with `ep`; casting them in place would change the fp32
    # program the numeric check uses as its reference, so cast a copy.
    inner = copy.deepcopy(ep.module()).to(device=target, dtype=low)
    if precision in REDUCED:
        drop_dtype_assertions(inner)
        cast_weight_matmul_operands(inner, low)
        clamp_float_extremes(inner, low)

    if quantization is not None:
        # GPT-2's Conv1D products as linear layers, so that their weights are quantized too
        addmm_as_linear(inner)
        # the reference rounds each weight to the package's precision before quantizing it
        weights = getattr(torch, REDUCED[emulate]) if emulate in REDUCED else low
        # with fused products, CUDA int4 in the form their kernel reads (aotc's int4 groups)
        quantize_graph(
            inner, quantization, device, weights, calibration, emulate is not None, chosen_by,
            groups_product=fusions is not None,
        )  # fmt: skip
    if fusions is not None:
        found = fuse_products(inner)
        for field in dataclasses.fields(found):
            setattr(fusions, field.name, getattr(found, field.name))

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

    try:
        return torch.export.export(
            CastWrapper(inner),
            tuple(example),
            dynamic_shapes=signature_dynamic_shapes(signature),
            strict=False,
        )
    except Exception as exc:
        if quantization is not None:
            raise BuildError(
                f"the program cannot be quantized {quantization.scheme} ({type(exc).__name__}: "
                f"{first_line(exc)[:200]}); build it without --quantize"
            ) from exc
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
