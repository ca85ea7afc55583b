"""The build's numeric check: the package (run in a child process) against the ExportedProgram run eagerly.

Inputs: the export's example inputs, plus every dynamic dim at its min and at its max.
Per output: max abs and max rel difference and the tolerance used; one place decides pass/fail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aotc.child_process import CHILD_TIMEOUT_S, child_command, child_env, failure_line
from aotc.compiler.package_writer import VERIFY_PREFIX
from aotc.errors import BuildError, NumericMismatchError
from aotc.export.eager_reference import CALLS_PER_CASE, eager_outputs, input_cases
from aotc.quiet import verbose

if TYPE_CHECKING:
    from aotc_runtime import NumericCheck

STRICT_FP32_ENV = (
    "AOTC_CHECK_STRICT_FP32"  # tells the child to run with TF32 off, as the reference did
)


def reference_program(ep, signature: dict, device: str, precision, quantization=None):
    """(the program the check runs eagerly, the signature it checks against) for a package of
    `precision`: fp32 on `device`, its weights rounded to the package's precision (and quantized
    as `quantization` says, then dequantized), and the signature declaring the state in the dtype
    the package keeps it in (eager_outputs rounds the reference's state to it after each call).
    The build and `aotc verify` share it."""
    from aotc.config import Precision
    from aotc.export.placement import place_program, signature_in_precision, weights_rounded_to

    if quantization is not None:
        quantization = quantization.fresh()
    placed = place_program(
        ep,
        device,
        Precision.FP32,
        signature,
        quantization,
        emulate=precision if quantization else None,
    )
    return weights_rounded_to(placed, precision), signature_in_precision(signature, precision)


def check_command(
    package_dir: Path, inputs_path: Path, outputs_path: Path, calls: int = CALLS_PER_CASE
) -> list:
    return child_command(
        "aotc.compiler.verify_child",
        str(package_dir),
        str(inputs_path),
        str(outputs_path),
        str(calls),
    )


def run_in_child(
    package_dir: Path, cases, strict: bool = False, calls: int = CALLS_PER_CASE
) -> list:
    """Run the package on each case in a fresh process, `calls` times each; a crash becomes a
    BuildError."""
    import torch

    with tempfile.TemporaryDirectory(prefix=f"{VERIFY_PREFIX}{os.getpid()}-") as work:
        inputs_path, outputs_path = Path(work) / "inputs.pt", Path(work) / "outputs.pt"
        torch.save([[t.cpu() for t in tensors] for _label, tensors in cases], inputs_path)
        env = child_env(**{STRICT_FP32_ENV: "1" if strict else "0"})
        try:
            proc = subprocess.run(
                check_command(package_dir, inputs_path, outputs_path, calls),
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT_S,
                env=env,
            )
        except subprocess.TimeoutExpired:
            raise BuildError(
                f"the compiled package did not finish its check run within {CHILD_TIMEOUT_S}s; rerun with --verbose"
            ) from None
        if proc.returncode != 0:
            if verbose():  # everything the child said, above the one-line error
                print(proc.stderr, file=sys.stderr, end="" if proc.stderr.endswith("\n") else "\n")
            raise BuildError(_describe_child_failure(proc))
        return torch.load(outputs_path, weights_only=True)


def _describe_child_failure(proc) -> str:
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return (
            f"the compiled package crashed when loaded and run in a child process ({name}); nothing was written. "
            "A crash inside libstdc++ (std::regex) means the model .so and the process disagree on the C++ "
            "library: keep the default -Wl,-Bsymbolic link and build with a g++ whose libstdc++ torch loads "
            "(set AOTC_CXX=/usr/bin/g++); otherwise rerun with --verbose and report it"
        )
    return f"the compiled package failed its check run in a child process: {failure_line(proc.stderr, proc.returncode)}"


# Precisions whose check bounds each difference by the output's largest value rather than the
# element's own (scale_relative in compare)
SCALE_RELATIVE = ("bf16", "fp16")


def compare(
    outputs: list,
    references: list,
    atol: float,
    rtol: float,
    names: list,
    labels: list,
    scale_relative: bool = False,
) -> list:
    """Worst difference per output over all cases: [{name, max_abs, max_rel, atol, rtol, ok, worst_case}].

    An element passes when |package - eager| <= atol + rtol * |eager|; with `scale_relative`
    (bf16, fp16), rtol multiplies the largest |eager| of that output in that case instead. A
    reduced-precision error comes from rounding the sums an element is made of, so it scales with
    the values those sums meet, not with how close to zero the result happens to land: a Llama-1B
    shape's logits after a 1,024-token prefill in bf16 differ by 0.085 where they are near zero
    (H100, 2026-11-25), an element-wise max rel of 1.4e4, and transformers in bf16 differs alike."""
    import torch

    report = []
    for index, name in enumerate(names):
        worst = {
            "name": name,
            "max_abs": 0.0,
            "max_rel": 0.0,
            "atol": atol,
            "rtol": rtol,
            "ok": True,
            "worst_case": labels[0],
        }
        for label, got_all, want_all in zip(labels, outputs, references):
            got, want = got_all[index], want_all[index]
            if got.shape != want.shape:
                worst.update(
                    ok=False,
                    max_abs=float("inf"),
                    max_rel=float("inf"),
                    worst_case=f"{label}: shape {list(got.shape)} vs eager {list(want.shape)}",
                )
                continue
            got64, want64 = got.to(torch.float64), want.to(torch.float64)
            diff = (got64 - want64).abs()
            max_abs = float(diff.max()) if diff.numel() else 0.0
            rel = diff / want64.abs()
            rel = rel[torch.isfinite(rel)]
            max_rel = float(rel.max()) if rel.numel() else 0.0
            scale = want64.abs()
            if scale_relative and scale.numel():
                scale = scale[torch.isfinite(scale)].max() if torch.isfinite(scale).any() else scale
            ok = bool(torch.all(diff <= atol + rtol * scale)) if diff.numel() else True
            if max_abs >= worst["max_abs"]:
                worst.update(
                    max_abs=max_abs, max_rel=max(max_rel, worst["max_rel"]), worst_case=label
                )
            worst["ok"] = worst["ok"] and ok
        report.append(worst)
    return report


def check_numerics(
    ep,
    signature,
    package_dir: Path,
    device: str,
    atol: float,
    rtol: float,
    allow_mismatch: bool,
    strict: bool = False,
    reference=None,
    extra_sizes: Sequence[dict] = (),
    fix: str = "loosen --atol/--rtol, try another --mode, or pass --allow-mismatch to keep the package anyway",
    task: dict | None = None,
    precision: str = "fp32",
    scale_relative: bool | None = None,
) -> NumericCheck:
    """Run the check; return the manifest's numeric_check record or raise NumericMismatchError.

    `strict`: both sides run with TF32 off (an fp32 package on CUDA; see precision.strict_fp32).
    `reference`: (description, function of the cases -> outputs, as eager_outputs gives them) when
    the reference is not `ep` run eagerly (an ONNX model built without its artifact).
    `task`: a generation package, checked on its logits' spread and greedy tokens
    (generation_check.py) with atol/rtol as tolerances.GENERATION gives them.
    """
    from aotc.math_mode import strict_fp32
    from aotc_runtime import NumericCheck, OutputCheck

    if task is not None and reference is None:
        from aotc.compiler.generation_check import check_generation, mismatch_fix
        from aotc.compiler.tolerances import computed_precision

        quantized = bool(scale_relative) and precision not in SCALE_RELATIVE
        precision = computed_precision(precision, signature)
        model_dtype = computed_precision("fp32", signature)  # bf16/fp16 for a model in half
        settings = {
            "atol": atol,
            "rtol": rtol,
            "allow_mismatch": allow_mismatch,
            "strict": strict,
            "precision": precision + (" with quantized activations" if quantized else ""),
            "described": f"ExportedProgram run eagerly on {device}",
            "fix": mismatch_fix(precision, model_dtype),
        }
        return check_generation(ep, signature, package_dir, device, settings, task, run_in_child)
    cases = input_cases(ep, signature, device, extra_sizes, task)
    if reference is not None:
        described, run_reference = reference
        references = run_reference(cases)
    else:
        described = "ExportedProgram run eagerly on " + device
        with strict_fp32() if strict else contextlib.nullcontext():
            references = eager_outputs(ep, cases, signature)
    outputs = run_in_child(
        package_dir, cases, strict
    )  # CALLS_PER_CASE calls per case: first call, then repeat call
    labels = [f"{label}, {call} call" for label, _ in cases for call in ("first", "repeat")]
    names = [o["name"] for o in signature["outputs"]] or [
        f"output_{i}" for i in range(len(references[0]))
    ]
    if scale_relative is None:
        scale_relative = precision in SCALE_RELATIVE
    report = compare(outputs, references, atol, rtol, names, labels, scale_relative)
    if scale_relative:
        what = precision if precision in SCALE_RELATIVE else "quantized activations"
        described += f" ({what}: rtol times each output's largest |value|)"
    record = NumericCheck(
        reference=described + (", TF32 off on both sides" if strict else ""),
        cases=tuple(label for label, _ in cases),
        atol=atol,
        rtol=rtol,
        outputs=tuple(OutputCheck(**r) for r in report),
        passed=all(r["ok"] for r in report),
    )
    if not record.passed and not allow_mismatch:
        bad = max((r for r in report if not r["ok"]), key=lambda r: r["max_abs"])
        raise NumericMismatchError(
            f"package output '{bad['name']}' differs from eager by max abs {bad['max_abs']:.3g} "
            f"(max rel {bad['max_rel']:.3g}) "
            f"at {bad['worst_case']}, above atol={atol:g} rtol={rtol:g}; {fix}"
        )
    return record
