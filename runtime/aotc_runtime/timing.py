"""Latency measurement shared by `aotc run --iters` and `aotc bench`.

GPU calls are timed with CUDA events around each call (what the GPU stream saw, launch gaps
included), CPU calls with perf_counter. Summaries are medians and percentiles, never means alone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def time_calls(
    fn: Callable[[], object], iters: int, device: torch.device, warmup: int = 0
) -> list[float]:
    """Call `fn()` `warmup` times untimed, then `iters` times; return each call's milliseconds."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        return _time_cuda(fn, iters)
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def _time_cuda(fn: Callable[[], object], iters: int) -> list[float]:
    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    torch.cuda.synchronize()
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def percentile(sorted_samples: list[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted samples."""
    index = min(len(sorted_samples) - 1, max(0, round(fraction * len(sorted_samples) + 0.5) - 1))
    return sorted_samples[index]


def summarize(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "median_ms": statistics.median(ordered),
        "p90_ms": percentile(ordered, 0.90),
        "p99_ms": percentile(ordered, 0.99),
        "min_ms": ordered[0],
        "stdev_ms": statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
    }


def gaps_ms(stamps: list[float]) -> list[float]:
    """The milliseconds between consecutive `time.perf_counter()` stamps (a token's each): the
    decode steps after the first token, as generate, chat and bench report them."""
    return [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# A run's slowest tokens this many times its median one, and this much slower: other work competes
# for the CPU (a descheduled OpenMP thread stalls every barrier), not the model's cost
STALL_FACTOR = 4.0
STALL_MIN_MS = 20.0


def stall_note(gaps_ms: list[float], threads: int | None) -> str | None:
    """One line when the gaps between tokens have a p99 far above their p50, naming the flag that
    helps (fewer CPU threads), else None. Fewer than 8 gaps say nothing."""
    if len(gaps_ms) < 8:
        return None
    ordered = sorted(gaps_ms)
    p50, p99 = statistics.median(ordered), percentile(ordered, 0.99)
    if p99 < STALL_FACTOR * p50 or p99 - p50 < STALL_MIN_MS:
        return None
    fix = (
        "rerun with --threads 1, or fewer threads than free cores"
        if threads is not None and threads > 1
        else "other work on this machine competes for its CPU"
    )
    return (
        f"note: the slowest tokens took {p99 / p50:.0f}x the median one (p99 {p99:.1f} ms, "
        f"p50 {p50:.1f} ms): {fix}"
    )
