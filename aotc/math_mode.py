"""How the compiler and its baselines compute: the torch dtype of each reduced precision, and the
TF32 switches (a tf32 build, its baselines, and the fp32 numeric check on CUDA)."""

from __future__ import annotations

import contextlib

from aotc.config import Precision

REDUCED = {Precision.BF16: "bfloat16", Precision.FP16: "float16"}


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
