"""`aotc bench`: a package against eager and torch.compile of the artifact it was built from.

All contenders run in one process on the same inputs, interleaved: each round runs a slice of
every contender's timed calls in turn (the order rotates), so machine drift (clock boost, a noisy
neighbour, thermal throttling) hits all of them alike. Timing is runtime/aotc_runtime/timing.py:
CUDA events on GPU, perf_counter on CPU. The contenders and their timed rounds are
aotc/bench/contenders.py; the package, artifact and batch sizes checked, aotc/bench/target.py. Cold
starts run in fresh processes (aotc/bench/cold.py); the table and JSON are aotc/bench/report.py,
the plot aotc/bench/plot.py; what is asked, aotc/bench/options.py. A text-generation package is timed per token instead
(aotc/bench/generation_bench.py).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from aotc.bench.contenders import (
    contender_names,
    first_call_and_warmup,
    interleaved,
    model_that_runs,
    onnxruntime_package,
    place_baseline,
    setup_contender,
)
from aotc.bench.options import BenchConfig, CallCounts
from aotc.bench.report import REPORT_VERSION, package_summary
from aotc.bench.target import batch_axis, bench_device, resolve_artifact, resolve_batch_sizes
from aotc.errors import UserInputError
from aotc.math_mode import tf32_matmuls

if TYPE_CHECKING:
    from aotc_runtime import Signature

COMPILE_WEIGHT = 20  # a torch.compile first call weighs ~20 timed slices on the progress bar


def bench_package(cfg: BenchConfig, bar=None) -> dict:
    """Measure the package and its baselines; return the report (JSON-ready dict). A
    text-generation package goes to aotc/bench/generation_bench.py."""
    cfg.validate()
    import torch

    from aotc_runtime.threads import set_threads

    # first: inter-op threads are set once, before any parallel work; the report's machine
    # records what torch then uses (torch_threads), and the children are given the same
    set_threads(cfg.threads)

    from aotc.bench.cold import cold_start_plan, fresh_compile_cache, measure_cold_starts
    from aotc.bench.machine import machine_description
    from aotc.progress import ProgressBar
    from aotc_runtime import read_manifest

    manifest = read_manifest(Path(cfg.package))
    if manifest.generation is not None:
        from aotc.bench.generation_bench import bench_generation

        return bench_generation(cfg, manifest, bar)
    counts = cfg.for_one_call()
    names = contender_names(cfg, manifest)
    signature = manifest.signature
    batch_sizes = resolve_batch_sizes(signature, cfg.batch_sizes)
    baselines = [
        n for n in names if n in ("eager", "onnxruntime") or n.startswith("compile:")
    ]  # what needs the artifact
    artifact = resolve_artifact(cfg, manifest) if baselines else None
    device = bench_device(cfg, manifest)
    if "onnxruntime" in names and device.type != "cpu":
        raise UserInputError(
            "--against onnxruntime is a CPU baseline (this onnxruntime has no CUDA); bench a CPU package"
        )
    rounds = min(cfg.rounds, counts.iters)
    cold_plan = cold_start_plan(names, counts.cold_runs) if counts.cold_start else []
    bar = bar or ProgressBar(enabled=False)
    compiles = sum(name.startswith("compile:") for name in names)
    bar.begin(
        len(names)
        + len(batch_sizes) * (len(names) * (1 + rounds) + compiles * COMPILE_WEIGHT)
        + sum(case.weight for _run, case in cold_plan)
    )
    work = tempfile.TemporaryDirectory(prefix="aotc-bench-")
    others = {}
    if "onnxruntime" in names:
        bar.note("building the ONNX Runtime package of the artifact")
        others["onnxruntime"] = onnxruntime_package(artifact, Path(work.name))
    with (
        work,
        fresh_compile_cache(),
        tf32_matmuls(manifest.precision == "tf32"),
    ):  # baselines of a tf32 package use TF32 too
        ep = None
        if artifact is not None:
            bar.note(f"loading {artifact}")
            ep = place_baseline(artifact, manifest, device)
        with torch.inference_mode():
            contenders = []
            try:
                for name in names:
                    bar.step(f"loading {name}")
                    contenders.append(
                        setup_contender(name, ep, Path(others.get(name, cfg.package)))
                    )
                rows = [
                    row
                    for batch in batch_sizes
                    for row in measure_batch(contenders, signature, batch, cfg, counts, device, bar)
                ]
            finally:
                for contender in contenders:
                    if contender.native is not None:
                        contender.native.close()
        cold = (
            measure_cold_starts(cold_plan, Path(cfg.package), artifact, manifest, bar, others)
            if cold_plan
            else None
        )
    bar.finish()
    return {
        "report_version": REPORT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "package": package_summary(cfg.package, manifest),
        "artifact": str(artifact) if artifact else None,
        "machine": machine_description(device),
        "settings": {
            "iters": counts.iters,
            "warmup": counts.warmup,
            "rounds": rounds,
            "batch_sizes": list(batch_sizes),
            "example_batch_size": batch_axis(signature)[1],
            "seed": cfg.seed,
            "timer": "cuda-events" if device.type == "cuda" else "perf_counter",
            "memory": "cuda-allocator-peak" if device.type == "cuda" else "rss-growth",
            "cold_start": counts.cold_start,
            "cold_runs": counts.cold_runs if counts.cold_start else 0,
        },
        "contenders": [
            {"name": c.name, "kind": c.kind, "mode": c.mode, "setup_ms": c.setup_ms}
            for c in contenders
        ],
        "results": rows,
        "cold_start": cold,
    }


def measure_batch(
    contenders: list,
    signature: Signature,
    batch: int,
    cfg: BenchConfig,
    counts: CallCounts,
    device,
    bar,
) -> list:
    """First call, warm-up and interleaved timed calls of every contender at one batch size."""
    from aotc_runtime import summarize

    axis, _example = batch_axis(signature)
    sizes = {axis: batch} if isinstance(axis, str) else {}
    inputs = signature.random_inputs(seed=cfg.seed, sizes=sizes, device=device)
    firsts = {}
    for contender in contenders:
        compiles = " (compiling)" if contender.kind == "compile" else ""
        bar.step(
            f"batch {batch}: first call and warm-up of {contender.name}{compiles}",
            1 + COMPILE_WEIGHT * bool(compiles),
        )
        firsts[contender.name] = first_call_and_warmup(contender, inputs, counts.warmup, device)
    samples = interleaved(
        contenders, inputs, counts.iters, cfg.rounds, device, bar, f"batch {batch}"
    )
    latency = {name: summarize(times) for name, times in samples.items()}
    package_median = latency["package"]["median_ms"]
    return [
        {
            "contender": c.name,
            "batch_size": batch,
            **firsts[c.name],
            "latency": latency[c.name],
            "throughput_items_per_s": batch * 1e3 / latency[c.name]["median_ms"]
            if latency[c.name]["median_ms"] > 0
            else None,
            # > 1: the package is that many times faster than this contender (medians).
            "package_speedup": latency[c.name]["median_ms"] / package_median
            if package_median > 0
            else None,
            **({"ran": model_that_runs(c, inputs)} if c.kind == "package" else {}),
        }
        for c in contenders
    ]
