"""Build every (variant, candidate) pair, check it, time the survivors of each variant side by side.

A variant is one model the package will hold: the artifact as exported (dynamic), or a static
member of --specialize. Each candidate build is a child `aotc build` process: a compiler crash or
a hang costs that candidate, never the search, and the budget can stop it mid-compile (its whole
process group). Builds go round-robin, candidate by candidate over the variants, so a budget that
runs out leaves every variant with its cheapest candidates done rather than one variant with all.

Timing is the same interleaved loop as `aotc bench` (aotc/bench/contenders.py): every passing
candidate of a variant loaded in this process, on the variant's example inputs, slices of calls
in rotating order, medians compared.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from aotc.config import BuildConfig
from aotc.tune.cache import TuneCache, key_of
from aotc.tune.candidates import Candidate

TIMED_SECONDS = 2.0  # timed calls per candidate, roughly: enough for a stable median
MIN_CALLS, MAX_CALLS, ROUNDS = 10, 300, 10
MISMATCH_EXIT = 6  # NumericMismatchError: the candidate is over the tolerance
# A later candidate (or cuDNN benchmarking) is kept only when its median is lower by more than this:
# on the H100, densenet121's and resnet50's candidates all measured within 1% of each other, run
# to run; within the noise, the simpler build wins (and cuDNN benchmarking, which costs a 1.1 GB
# allocator peak at its first call on densenet121, stays off).
MIN_GAIN = 0.02


@dataclass
class Variant:
    label: str  # "dynamic", or the member's dims: "B=8"
    artifact: Path
    sizes: dict  # {} for the dynamic model, {"B": 8} for a member
    signature: object  # aotc_runtime.Signature of what this variant's package takes


@dataclass
class Trial:
    variant: Variant
    candidate: Candidate
    options: dict  # the Inductor options it adds over the preset (the user's --option included)
    key: str
    # pending -> passed | failed | over tolerance | skipped | not tried | cut off
    status: str = "pending"
    reason: str = ""
    build_seconds: float | None = None
    cached: bool = False
    package: Path | None = None
    latency: dict = field(default_factory=dict)
    # CUDA: timed again with cuDNN's algorithm benchmarking on; kept on when that is faster
    cudnn_benchmark: bool = False
    latency_cudnn_off: dict = field(default_factory=dict)
    # why a model with convolutions was not timed with cuDNN benchmarking, when it was not
    cudnn_not_timed: str = ""

    def to_json(self) -> dict:
        record = {
            **self.candidate.to_json(),
            "options": dict(self.options),
            "status": self.status,
            "reason": self.reason or None,
            "build_seconds": self.build_seconds,
            "cached_build": self.cached,
        }
        # to the nanosecond: a small model's CPU median is a few microseconds, and rounded to
        # 0.1 µs it would lose the 2% the choice was made by (MIN_GAIN)
        if self.latency:
            record.update(
                median_ms=round(self.latency["median_ms"], 6),
                p90_ms=round(self.latency["p90_ms"], 6),
                calls=self.latency["n"],
            )
        if self.latency_cudnn_off:
            record.update(
                cudnn_benchmark=self.cudnn_benchmark,
                median_ms_cudnn_benchmark_off=round(self.latency_cudnn_off["median_ms"], 6),
            )
        if self.cudnn_not_timed:
            record["cudnn_benchmark_not_timed"] = self.cudnn_not_timed
        return record


def trial_key(
    cfg: BuildConfig, variant: Variant, candidate: Candidate, options: dict, base: dict
) -> str:
    return key_of(
        {
            **base,
            "sizes": variant.sizes,
            "backend": candidate.backend,
            "options": options,
            "cudnn_benchmark": cfg.cudnn_benchmark,
            "mode": cfg.mode.value,
            "precision": cfg.precision.value,
            "device": cfg.device,
            "cpu_isa": cfg.cpu_isa,
            "bsymbolic": cfg.bsymbolic,
            "atol": cfg.atol,
            "rtol": cfg.rtol,
        }
    )


def build_command(cfg: BuildConfig, trial: Trial, output: Path) -> list[str]:
    command = [
        sys.executable, "-m", "aotc", "build", str(trial.variant.artifact), "-o", str(output),
        "--force", "--quiet", "--json", "--mode", cfg.mode.value, "--device", cfg.device,
        "--precision", cfg.precision.value, "--cpu-isa", cfg.cpu_isa,
        "--backend", trial.candidate.backend,
    ]  # fmt: skip
    for key, value in trial.options.items():
        command += ["--option", f"{key}={json.dumps(value)}"]  # JSON is YAML: read back exactly
    for flag, value in (("--atol", cfg.atol), ("--rtol", cfg.rtol)):
        if value is not None:
            command += [flag, repr(value)]
    if not cfg.bsymbolic:
        command.append("--no-bsymbolic")
    if cfg.cudnn_benchmark:
        command.append("--cudnn-benchmark")
    return command


def run_build(
    command: list[str], timeout: float | None, running: set | None = None
) -> tuple[int | None, str]:
    """(exit code or None if cut off, its last stderr line). The child leads its own process group,
    so cutting it off stops its compile workers too; `running` holds it while it runs, so the
    search can stop every build at once (Ctrl-C)."""
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if running is not None:
        running.add(child)
    try:
        _out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(child)
        return None, ""
    except BaseException:
        stop(child)
        raise
    finally:
        if running is not None:
            running.discard(child)
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    return child.returncode, lines[-1] if lines else ""


def stop(child: subprocess.Popen) -> None:
    """Kill a build and its compile workers, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.communicate()


def build_trials(
    trials: list[Trial], cfg: BuildConfig, cache: TuneCache, deadline: float | None, progress
) -> None:
    """Build (or find in the cache) every trial, in order, `cfg.tune_jobs` at a time."""
    running: set = set()

    def build_one(index: int, trial: Trial) -> None:
        record = cache.read_build(trial.key)
        folder = cache.build_dir(trial.key) / "package"
        if record and (record["status"] != "passed" or (folder / "manifest.json").is_file()):
            damage = cached_package_problem(folder) if record["status"] == "passed" else None
            if damage is None:
                trial.status, trial.reason = record["status"], record.get("reason") or ""
                trial.build_seconds, trial.cached = record.get("build_seconds"), True
                trial.package = folder if trial.status == "passed" else None
                return
            progress.warn(
                f"the tune cache's build of {trial.candidate.name} for {trial.variant.label} is "
                f"damaged ({damage}); removed it and building it again"
            )
        # The first build (the package without --tune) always runs to its end: without it there
        # is no package; every later one gets what is left of the budget.
        remaining = None if index == 0 or deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            trial.status, trial.reason = "not tried", "the tuning budget was spent"
            return
        progress.note(
            f"tune: building {trial.candidate.name} for {trial.variant.label} "
            f"({index + 1}/{len(trials)})"
        )
        cache.forget_build(trial.key)
        begin = time.monotonic()
        code, last_line = run_build(build_command(cfg, trial, folder), remaining, running)
        trial.build_seconds = round(time.monotonic() - begin, 2)
        if code is None:
            trial.status = "cut off"
            trial.reason = (
                f"the tuning budget ran out after {trial.build_seconds:.0f}s of its build"
            )
            cache.forget_build(trial.key)  # a larger budget may finish it: not remembered
            return
        if code == 0:
            trial.status, trial.package = "passed", folder
        else:
            trial.status = "over tolerance" if code == MISMATCH_EXIT else "failed"
            trial.reason = last_line.removeprefix("error: ") or f"exit {code}"
        cache.write_build(
            trial.key,
            {"status": trial.status, "reason": trial.reason, "build_seconds": trial.build_seconds},
        )

    pool = ThreadPoolExecutor(max_workers=cfg.tune_jobs)
    futures = [pool.submit(build_one, i, t) for i, t in enumerate(trials)]
    try:
        for future in futures:
            future.result()
    except BaseException:
        # Ctrl-C (or a failure) lands here, in the main thread: the builds running in the worker
        # threads are stopped, not waited for, and the builds not started never start.
        for future in futures:
            future.cancel()
        for child in list(running):  # killed here, reaped by its own thread
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        raise
    finally:
        pool.shutdown(wait=True)


def cached_package_problem(folder: Path) -> str | None:
    """Why a cached build cannot be used as it is, or None: its manifest must read, its build must
    have finished, and every file must match the manifest's sha256 (what a package claims of
    itself; the assembled package's numeric check judges what it computes)."""
    from aotc_runtime import PackageError, check_finished, read_manifest, verify_files

    try:
        manifest = read_manifest(folder)
        check_finished(folder, manifest)
        verify_files(folder, manifest)
    except PackageError as exc:
        return str(exc).split("; rebuild")[0]
    return None


def time_variant(trials: list[Trial], device: str, cache: TuneCache, progress) -> bool:
    """Time the passing trials of one variant side by side; True if the medians came from the cache."""
    passing = [t for t in trials if t.status == "passed"]
    if not passing:
        return False
    search_key = key_of({"timed": [t.key for t in passing]})
    known = cache.read_search(search_key)
    if known and all(t.cached for t in passing) and set(known) >= {t.key for t in passing}:
        for trial in passing:
            _take(trial, known[trial.key])
        return True
    progress.note(f"tune: timing {len(passing)} candidate(s) for {passing[0].variant.label}")
    for trial, timed in zip(passing, measure(passing, device)):
        _take(trial, timed)
    cache.write_search(search_key, {t.key: measured(t) for t in passing})
    return False


def measured(trial: Trial) -> dict:
    return (
        {"on": trial.latency, "off": trial.latency_cudnn_off}
        if trial.latency_cudnn_off
        else {"off": trial.latency}
    )


def _take(trial: Trial, timed: dict) -> None:
    """Keep cuDNN benchmarking on only where it made the median lower."""
    off, on = timed["off"], timed.get("on")
    if on is None:
        trial.latency = off
        return
    trial.latency_cudnn_off = off
    trial.cudnn_benchmark = on["median_ms"] < off["median_ms"] * (1 - MIN_GAIN)
    trial.latency = on if trial.cudnn_benchmark else off


def uses_cudnn(trial: Trial, device_type: str) -> bool:
    """Whether the trial is worth timing with cuDNN benchmarking too: an AOTInductor CUDA model
    that calls cuDNN (convolutions; a model without them would time the same twice)."""
    if device_type != "cuda" or trial.candidate.backend != "aotinductor":
        return False
    return any(
        b"cudnn" in line or b"convolution" in line
        for line in _wrapper_lines(trial.package / "model.pt2")
    )


def _wrapper_lines(archive: Path):
    import zipfile

    with zipfile.ZipFile(archive) as zf:
        for name in zf.namelist():
            if name.endswith(".cpp") or name.endswith(".wrapper.cpp"):
                yield from zf.read(name).splitlines()


def measure(trials: list[Trial], device_type: str) -> list[dict]:
    """Interleaved timed calls of the trials' packages on the variant's example inputs; on CUDA,
    a model with convolutions is also loaded and timed with cuDNN benchmarking on (a separate
    load: a CUDA graph keeps the algorithms chosen when it was captured), after checking that
    its outputs agree with the model's own within the build's tolerance."""
    import torch

    import aotc_runtime
    from aotc.bench.contenders import Contender, first_call_and_warmup, interleaved
    from aotc.progress import ProgressBar

    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    signature = trials[0].variant.signature
    inputs = signature.random_inputs(seed=0, device=device)
    contenders, both = [], []
    for trial in trials:
        package = aotc_runtime.load(trial.package)
        contenders.append(Contender(trial.candidate.name, "package", None, call=package))
        # (a package already built with --cudnn-benchmark has nothing to compare it with)
        if uses_cudnn(trial, device_type) and not package.manifest.runtime.cudnn_benchmark:
            benchmarked = aotc_runtime.load(trial.package)
            benchmarked.use_cudnn_benchmark(True)
            if _agree(package, benchmarked, inputs):
                name = f"{trial.candidate.name}+cudnn"
                contenders.append(Contender(name, "package", None, call=benchmarked))
                both.append(trial.candidate.name)
            else:
                trial.cudnn_not_timed = (
                    "its outputs differ from the default algorithms' beyond the check's tolerance"
                )
    with torch.inference_mode():
        estimates = []
        for contender in contenders:
            first_call_and_warmup(contender, inputs, 3, device)
            sample = aotc_runtime.time_calls(lambda c=contender: c.call(*inputs), 3, device)
            estimates.append(max(min(sample), 1e-3))
        calls = int(TIMED_SECONDS * 1e3 / max(estimates))
        calls = max(MIN_CALLS, min(MAX_CALLS, calls))
        samples = interleaved(contenders, inputs, calls, ROUNDS, device, ProgressBar(False), "tune")
    results = []
    for trial in trials:
        name = trial.candidate.name
        timed = {"off": aotc_runtime.summarize(samples[name])}
        if name in both:
            timed["on"] = aotc_runtime.summarize(samples[f"{name}+cudnn"])
        results.append(timed)
    return results


def _agree(package, benchmarked, inputs) -> bool:
    """The two loads' outputs within the tolerance the package's numeric check used."""
    import torch

    from aotc_runtime import flatten_outputs

    check = package.manifest.numeric_check
    with torch.inference_mode():
        ours = flatten_outputs(package(*inputs))
        theirs = [t.clone() for t in flatten_outputs(benchmarked(*inputs))]
    return all(
        torch.allclose(a.float(), b.float(), atol=out.atol, rtol=out.rtol)
        for a, b, out in zip(ours, theirs, check.outputs)
    )


def choose(trials: list[Trial]) -> Trial | None:
    """The passing trial with the lowest median; the others are marked with why they lost."""
    timed = [t for t in trials if t.status == "passed" and t.latency]
    if not timed:
        return None
    best = timed[0]  # in the file's order: the simpler builds first
    for trial in timed[1:]:
        if trial.latency["median_ms"] < best.latency["median_ms"] * (1 - MIN_GAIN):
            best = trial
    for trial in timed:
        if trial is best:
            trial.status = "chosen"
        else:
            trial.status = "slower"
            ratio = trial.latency["median_ms"] / best.latency["median_ms"]
            trial.reason = f"{ratio:.3f}x the median of {best.candidate.name}"
            if ratio < 1:
                trial.reason += f", not {MIN_GAIN:.0%} faster than it"
    return best
