"""Default numeric tolerances: one place decides how close the package must be to eager.

Keyed by the precision the package computes in. fp32 allows for Inductor reordering reductions
and fusing ops (a few ulps per op that add up through deep nets); reduced precisions allow for
their mantissa (bf16 has 8 bits, fp16 11, tf32 matmuls 11).
"""

from __future__ import annotations

from aotc.quantize_schemes import BF16_ACTIVATIONS

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
# Schemes whose products take bf16 activations on a device (quantize_schemes.BF16_ACTIVATIONS):
# their reference rounds where they round, but a sum one ulp apart rounds to the other bf16
# neighbour, and through SmolLM2's 30 layers such flips moved the logits by 0.056 of their
# spread: bf16's bound.
WEIGHT_ONLY_FP32 = (1e-3, 1e-3)  # fp32 products that read int8/int4 weights sum in another order


# A text-generation package is checked on what generation reads: each row of next-token logits
# within atol + rtol x that row's standard deviation (the logits' spread), and its greedy tokens
# (aotc/compiler/generation_check.py). rtol is a fraction of the spread, by the precision's
# mantissa and measured on the zoo's LMs (docs/build-internals.md#the-check-of-a-generation-package):
# fp32 differs from fp64 by 2e-5 of the spread; eager transformers in bf16 from fp32 by up to 0.39
# and in fp16 by up to 0.048, where a bf16 package differs from its reference by 0.23 and an fp16
# one by 0.025. atol only keeps a row of equal logits (spread 0) from failing on rounding.
GENERATION = {
    "fp32": (1e-5, 1e-3),
    "tf32": (1e-3, 0.125),  # matmuls with fp16's 11-bit mantissa
    "fp16": (1e-3, 0.125),
    "bf16": (1e-2, 0.5),
}
GENERATION_QUANTIZED_FP32 = (1e-4, 1e-2)  # int8/int4 weights read in another order than eager's
# quantized activations round to a neighbouring level where the package's scale differs in its
# last bit; each such level moves the logits by a weight's size: bf16's allowance covers it
GENERATION_QUANTIZED_ACTIVATIONS = (1e-2, 0.5)


def tolerance(
    precision: str,
    device: str,
    atol: float | None,
    rtol: float | None,
    quantize: str | None = None,
    task: dict | None = None,
    signature: dict | None = None,
) -> tuple[float, float]:
    """(atol, rtol) of a build's check: the flags where given, else the defaults for the precision
    (and the quantization scheme); for a generation package (`task`), GENERATION's for the
    precision its program computes in (computed_precision)."""
    if task is not None:
        default_atol, default_rtol = GENERATION[computed_precision(precision, signature)]
        if (quantize, device) in BF16_ACTIVATIONS:
            default_atol, default_rtol = GENERATION["bf16"]
        elif quantize in QUANTIZED_ACTIVATIONS:
            default_atol, default_rtol = GENERATION_QUANTIZED_ACTIVATIONS
        elif quantize and precision == "fp32":
            default_atol, default_rtol = GENERATION_QUANTIZED_FP32
        return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)
    default_atol, default_rtol = DEFAULTS.get(f"{precision}-{device}", DEFAULTS[precision])
    if (quantize, device) in BF16_ACTIVATIONS:
        default_atol, default_rtol = DEFAULTS["bf16"]
    elif quantize in QUANTIZED_ACTIVATIONS:
        default_atol, default_rtol = QUANTIZED_ACTIVATIONS[quantize]
    elif quantize and precision == "fp32":
        default_atol, default_rtol = WEIGHT_ONLY_FP32
    return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)


def scale_relative(precision: str, quantize: str | None = None, device: str | None = None) -> bool:
    """Whether the check bounds each difference by its output's largest |value| (verify.compare)."""
    return (
        precision in ("bf16", "fp16")
        or quantize in QUANTIZED_ACTIVATIONS
        or (quantize, device) in BF16_ACTIVATIONS
    )


_HALF_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}


def computed_precision(precision: str, signature: dict | None) -> str:
    """The precision a package's program computes in: `precision`, unless the model was exported
    in bf16 or fp16 (a model loaded in bf16 returns bf16 logits). An fp32 build keeps the
    exported dtypes, so such a program computes in its own half type at any --precision, and
    eager in that type is its reference: each rounds its sums to 8 bits where Inductor's fused
    kernels round less often, a bf16 difference however the build is asked."""
    outputs = (signature or {}).get("outputs") or []
    halves = {_HALF_DTYPES[o["dtype"]] for o in outputs if o.get("dtype") in _HALF_DTYPES}
    if precision in ("fp32", "tf32") and halves:
        return "bf16" if "bf16" in halves else "fp16"
    return precision
