"""`aotc run` / `aotc-run`: load a package, feed it inputs, report outputs and latency."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch

from .concurrency import run_concurrently
from .package import load
from .tensor_io import flatten_outputs, read_inputs, write_outputs
from .timing import summarize, synchronize, time_calls


def run_package(
    path: str | os.PathLike,
    input_files: Sequence[str | os.PathLike] = (),
    output: str | os.PathLike | None = None,
    iters: int = 0,
    seed: int = 0,
    warmup: int = 3,
    public_key: str | os.PathLike | None = None,
    threads: int = 1,
) -> dict:
    """Run a package once (plus `iters` timed calls) and return a report dict (JSON-ready).

    `public_key` (PEM, from `aotc keygen`): refuse the package unless it is signed by its private key.
    `threads` > 1: load it for that many concurrent calls, and make the `iters` calls from each of
    that many threads at once; the report adds throughput ("concurrency").
    """
    started = time.perf_counter()
    package = load(path, public_key=public_key, threads=threads)
    loaded = time.perf_counter()
    if input_files:
        inputs = read_inputs(input_files, package.signature)
    else:
        inputs = package.signature.random_inputs(seed=seed, device=package.device)
    # Moved once here so timed calls measure the package, not host-to-device copies; the
    # signature check happens inside every Package call.
    inputs = [t.to(package.device) for t in inputs]
    with torch.inference_mode():
        first_start = time.perf_counter()
        result = package(*inputs)
        synchronize(package.device)
        first_ms = (time.perf_counter() - first_start) * 1e3
        latency = concurrency = None
        if iters > 0 and threads > 1:
            concurrency = run_concurrently(package, inputs, threads, iters)
            latency = concurrency["latency"]
        elif iters > 0:
            latency = summarize(
                time_calls(lambda: package(*inputs), iters, package.device, warmup=warmup)
            )
    if output:
        write_outputs(result, output, package.signature.output_names)
    outputs = flatten_outputs(result)
    return {
        "package": str(path),
        "device": str(package.device),
        "mode": package.manifest.mode,
        "inputs": f"random (seed {seed})" if not input_files else [str(f) for f in input_files],
        "outputs": [
            {"name": spec.name, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
            for spec, t in zip(package.signature.outputs, outputs)
        ],
        "load_ms": (loaded - started) * 1e3,
        "first_call_ms": first_ms,
        "iters": iters,
        "latency": latency,
        "concurrency": concurrency,
        "output_file": str(output) if output else None,
    }


def format_report(report: dict) -> str:
    lines = [f"package   {report['package']} ({report['mode']}, {report['device']})"]
    for out in report["outputs"]:
        lines.append(f"output    {out['name']}: {out['dtype']} {out['shape']}")
    lines.append(f"load      {report['load_ms']:.1f} ms")
    lines.append(f"first     {report['first_call_ms']:.2f} ms")
    lat = report["latency"]
    if lat:
        lines.append(
            f"latency   median {lat['median_ms']:.3f} ms  p90 {lat['p90_ms']:.3f} ms  p99 "
            f"{lat['p99_ms']:.3f} ms  ({lat['n']} calls)"
        )
    many = report.get("concurrency")
    if many:
        intra = f", {many['intra_op_threads']} intra-op each" if many["intra_op_threads"] else ""
        lines.append(
            f"threads   {many['threads']} calling at once{intra}: {many['calls_per_second']:.1f} calls/s "
            f"({many['calls']} calls in {many['seconds']:.2f} s)"
        )
    if report["output_file"]:
        lines.append(f"wrote     {report['output_file']}")
    return "\n".join(lines)
