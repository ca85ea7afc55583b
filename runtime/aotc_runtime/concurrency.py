"""Calling one package from several threads: the throughput run behind `aotc run --threads N`.

A package loaded with `load(path, threads=N)` holds N AOTInductor model instances, so N calls run
at once. On CPU each call's kernels are OpenMP loops that use every core by default: N threads of
all-core loops oversubscribe the machine (measured: 8 threads about 3.5x slower than one). Each
calling thread therefore gets cores // N intra-op threads (torch.set_num_threads applies to the
thread that calls it), which is also what a server that calls a package from N threads should do.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import torch

from .package import Package
from .timing import percentile, summarize, synchronize


def intra_op_threads(calling_threads: int) -> int:
    """OpenMP threads per calling thread so that all of them together use each core once."""
    return max(1, (os.cpu_count() or 1) // max(1, calling_threads))


def run_concurrently(
    package: Package,
    inputs: Sequence[torch.Tensor],
    threads: int,
    calls_per_thread: int,
    intra_op: int | None = None,
) -> dict:
    """`threads` threads each make `calls_per_thread` calls at once; throughput and latency.
    `intra_op`: each caller's intra-op threads on CPU (default: intra_op_threads(threads))."""
    samples: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start_line = threading.Barrier(threads + 1)
    per_thread = (intra_op or intra_op_threads(threads)) if package.device.type == "cpu" else None

    def worker(index: int) -> None:
        try:
            if per_thread is not None:
                torch.set_num_threads(per_thread)
            with torch.inference_mode():
                package(*inputs)  # this thread's first call (a CUDA-graph capture) is not timed
                synchronize(package.device)
                start_line.wait()
                for _ in range(calls_per_thread):
                    began = time.perf_counter()
                    package(*inputs)
                    synchronize(package.device)
                    samples[index].append((time.perf_counter() - began) * 1e3)
        except BaseException as exc:  # reported by the caller: a thread must not die silently
            errors.append(exc)
            start_line.abort()

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for thread in workers:
        thread.start()
    try:
        start_line.wait()
    except threading.BrokenBarrierError:
        pass
    began = time.perf_counter()
    for thread in workers:
        thread.join()
    wall = time.perf_counter() - began
    if errors:
        raise errors[0]
    merged = sorted(s for per in samples for s in per)
    return {
        "threads": threads,
        "intra_op_threads": per_thread,
        "calls": len(merged),
        "seconds": wall,
        "calls_per_second": len(merged) / wall if wall > 0 else None,
        "latency": summarize(merged),
        "p50_ms": percentile(merged, 0.5),
    }
