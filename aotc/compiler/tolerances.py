"""Default numeric tolerances: one place decides how close the package must be to eager.

Keyed by the precision the package computes in. fp32 allows for Inductor reordering reductions
and fusing ops (a few ulps per op that add up through deep nets); reduced precisions allow for
their mantissa (bf16 has 8 bits, fp16 11, tf32 matmuls 11).
"""

from __future__ import annotations

DEFAULTS = {
    "fp32": (1e-4, 1e-4),
    # On CUDA, cuDNN convolutions run in TF32 by default (torch.backends.cudnn.allow_tf32), in eager
    # and in the package alike, but fused differently: densenet121 differs by 4e-4 (H200, measured).
    "fp32-cuda": (2e-3, 2e-3),
    "tf32": (1e-2, 1e-2),
    "fp16": (1e-2, 1e-2),
    "bf16": (5e-2, 5e-2),
}


def tolerance(
    precision: str, device: str, atol: float | None, rtol: float | None
) -> tuple[float, float]:
    default_atol, default_rtol = DEFAULTS.get(f"{precision}-{device}", DEFAULTS[precision])
    return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)
