"""Place an ExportedProgram on the build device and in the build precision.

fp32 / tf32: the program is moved as is (tf32 is a matmul/conv math mode the runtime switches on).
bf16 / fp16: weights are cast and the model is re-exported inside a wrapper that casts floating
inputs down and floating outputs back up, so the package keeps the signature users exported
(same input and output dtypes) while computing in the reduced precision.
"""

from __future__ import annotations

import contextlib
import copy

from .config import Precision

REDUCED = {Precision.BF16: "bfloat16", Precision.FP16: "float16"}


def place_program(ep, device: str, precision: Precision, signature: dict):
    import torch
    from torch.export.passes import move_to_device_pass

    if device != "cpu":
        reshape_instead_of_view(ep)
    if precision not in REDUCED:
        return move_to_device_pass(ep, device) if device != "cpu" else ep
    low = getattr(torch, REDUCED[precision])
    # ep.module() shares its parameters with `ep`; casting them in place would change the fp32
    # program the numeric check uses as its reference, so cast a copy.
    inner = copy.deepcopy(ep.module()).to(device=device, dtype=low)

    class CastWrapper(torch.nn.Module):
        """Computes in reduced precision, keeps the exported float dtypes at the boundary."""

        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args):
            cast = [a.to(low) if a.is_floating_point() else a for a in args]
            out = self.module(*cast)
            return torch.utils._pytree.tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out)

    example = [t.to(device) for t in ep.example_inputs[0]]
    return torch.export.export(CastWrapper(inner), tuple(example), dynamic_shapes=dynamic_shapes(signature), strict=False)


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
    import torch

    dims = signature.get("dims") or {}
    if not dims:
        return None
    export_dims = {name: torch.export.Dim(name, min=info["min"], max=info["max"]) for name, info in dims.items()}
    return tuple(
        {axis: export_dims[e] for axis, e in enumerate(spec["shape"]) if isinstance(e, str)} or None
        for spec in signature["inputs"]
    )


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
