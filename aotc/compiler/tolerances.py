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


# A quantized package is checked against its own weights dequantized in fp32 (the reference the
# quantization pass builds), so what remains is arithmetic. Schemes that quantize activations too
# can round an activation to the neighbouring level where the package and the reference compute
# its scale in another order: one level of one activation, scaled by a weight.
QUANTIZED_ACTIVATIONS = {"int8-dynamic": (5e-2, 5e-2)}
WEIGHT_ONLY_FP32 = (1e-3, 1e-3)  # fp32 products that read int8/int4 weights sum in another order


def tolerance(
    precision: str,
    device: str,
    atol: float | None,
    rtol: float | None,
    quantize: str | None = None,
) -> tuple[float, float]:
    default_atol, default_rtol = DEFAULTS.get(f"{precision}-{device}", DEFAULTS[precision])
    if quantize in QUANTIZED_ACTIVATIONS:
        default_atol, default_rtol = QUANTIZED_ACTIVATIONS[quantize]
    elif quantize and precision == "fp32":
        default_atol, default_rtol = WEIGHT_ONLY_FP32
    return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)


def scale_relative(precision: str, quantize: str | None = None) -> bool:
    """Whether the check bounds each difference by its output's largest |value| (verify.compare)."""
    return precision in ("bf16", "fp16") or quantize in QUANTIZED_ACTIVATIONS
