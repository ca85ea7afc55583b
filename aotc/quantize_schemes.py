"""The --quantize schemes as the build's settings see them: names, devices, group sizes, each
layer's error bound, and the request the build's quantization pass fills in
(aotc/export/quantization.py does the work; docs/quantization.md says why each number is what it is).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMES = ("int8-weight-only", "int4-weight-only", "fp8", "int8-dynamic")
# How the levels are chosen: each weight rounded to its nearest ("rtn"), or GPTQ's choice on the
# same grid with the calibration text's activations (int4 text generation; export/gptq.py)
METHODS = ("rtn", "gptq")
GROUP_SIZES = (32, 64, 128, 256)
DEFAULT_GROUP_SIZE = 128
# The largest relative output error a layer may have on its example activations (docs/quantization.md):
# several times what the scheme gives a Gaussian weight (int8 0.009, int4 g128 0.10, fp8 0.027,
# int8-dynamic 0.012 with its activations), so a healthy layer passes and one whose outliers the scheme cannot
# hold (a few huge values per row flatten the rest to zero) fails.
ERROR_BOUNDS = {
    "int8-weight-only": 0.05,
    "int4-weight-only": 0.30,
    "fp8": 0.10,
    "int8-dynamic": 0.08,
}
DEVICES = {
    "int8-weight-only": ("cpu", "cuda"),
    "int4-weight-only": ("cpu", "cuda"),
    "fp8": ("cuda",),
    "int8-dynamic": ("cpu",),
}
# (scheme, device) whose products take bf16 activations and bf16 scales into a bf16 product,
# whatever the package's precision: the CPU's int4 and int8 kernels (quantized_linear.int4_cpu_mm,
# int8_cpu_mm). The packages are quantized on bf16 scales, their references round as the kernels
# do, and the build checks them with bf16's bounds (compiler/tolerances.py).
BF16_ACTIVATIONS = {("int4-weight-only", "cpu"), ("int8-weight-only", "cpu")}
FP8_BLOCK = 128  # input features per fp8 scale, at most (quantized_linear.fp8_blocks)


def fp8_block_size(k_in: int) -> int:
    """The input features one fp8 scale covers in a layer of `k_in`: FP8_BLOCK, or the largest
    power of two below it that divides `k_in` (64 for SmolLM2's 576; fp8 layers have k_in % 16 == 0)."""
    import math

    return math.gcd(k_in, FP8_BLOCK)


FP8_CAPABILITY = (8, 9)  # fp8 support: Ada (8.9) and Hopper (9.0) onwards
TINYGEMM_CAPABILITY = (8, 0)


@dataclass
class Quantization:
    """What --quantize asked for, and (filled in by quantize_graph) what it did."""

    scheme: str
    group_size: int | None = None  # int4 only
    skip: tuple = ()  # a layer whose name contains one of these stays in the base precision
    method: str = "rtn"  # METHODS
    calibration_chunks: list = field(default_factory=list)  # gptq: token ids per step call
    # gptq: weight target -> (levels, scale, zero), chosen once for the package and its reference
    calibrated: dict = field(default_factory=dict)
    layers: list = field(default_factory=list)  # [{name, shape, error, shared}] quantized
    kept: list = field(default_factory=list)  # [{name, why}] left in the base precision

    def __post_init__(self) -> None:
        # int4's groups as the package holds them, the default's too: the build, its record and
        # the bench's int4 contender all read this one value
        if self.scheme == "int4-weight-only" and self.group_size is None:
            self.group_size = DEFAULT_GROUP_SIZE

    def record(self) -> dict:
        """The manifest's `quantization`."""
        worst = max(self.layers, key=lambda layer: layer["error"], default=None)
        return {
            "scheme": self.scheme,
            # fp8: input features per scale (a layer whose input features it does not divide
            # takes the largest power of two that does: fp8_block_size)
            "group_size": FP8_BLOCK if self.scheme == "fp8" else self.group_size,
            "skip": list(self.skip),
            "method": self.method,
            **self._calibration(),
            "error_bound": ERROR_BOUNDS[self.scheme],
            "worst_layer": {"name": worst["name"], "error": worst["error"]} if worst else None,
            "layers": [
                {"name": layer["name"], "shape": layer["shape"], "error": layer["error"]}
                for layer in self.layers
            ],
            "kept": list(self.kept),
        }

    def _calibration(self) -> dict:
        if self.method != "gptq":
            return {}
        tokens = sum(len(chunk) for chunk in self.calibration_chunks)
        return {"calibration": {"text": "aotc/export/calibration_text.txt", "tokens": tokens}}

    def fresh(self) -> Quantization:
        """The same request with nothing done yet (the reference's pass fills its own), and the
        levels a calibrated method chose, which the reference stores as the package does."""
        return Quantization(
            self.scheme,
            self.group_size,
            self.skip,
            self.method,
            self.calibration_chunks,
            self.calibrated,
        )


def problems(scheme: str, group_size: int | None, device: str) -> list[str]:
    """What is wrong with --quantize SCHEME [--group-size N] on `device` (cpu or cuda)."""
    found = []
    if scheme not in SCHEMES:
        return [f"--quantize {scheme} is not one of {', '.join(SCHEMES)}"]
    if device not in DEVICES[scheme]:
        other = {
            "fp8": "on the CPU use int8-weight-only or int8-dynamic",
            "int8-dynamic": "on CUDA use int8-weight-only or fp8",
        }[scheme]
        found.append(f"--quantize {scheme} runs on {' and '.join(DEVICES[scheme])} only; {other}")
    if group_size is not None and scheme != "int4-weight-only":
        found.append("--group-size goes with --quantize int4-weight-only; leave it out")
    if group_size is not None and group_size not in GROUP_SIZES:
        found.append(f"--group-size {group_size} is not one of {', '.join(map(str, GROUP_SIZES))}")
    if device == "cuda" and scheme in ("fp8", "int4-weight-only"):
        found += _gpu_problems(scheme)
    return found


def _gpu_problems(scheme: str) -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []  # said elsewhere: --device cuda on a machine without one
    have = torch.cuda.get_device_capability(0)
    need = FP8_CAPABILITY if scheme == "fp8" else TINYGEMM_CAPABILITY
    if have >= need:
        return []
    name = torch.cuda.get_device_name(0)
    return [
        f"--quantize {scheme} needs a GPU of compute capability {need[0]}.{need[1]} or newer; "
        f"{name} is {have[0]}.{have[1]}: use int8-weight-only"
    ]
