"""What one decode step of a text-generation package spends its GPU time on.

For each package: a greedy generation of 1 token and one of 1 + --steps tokens after the same
--prompt-tokens prompt, each under the profiler; the difference, kernel by kernel, is --steps decode
steps (on a reduce-overhead package, CUDA-graph replays) without the prefill. Per step it reports:

- wall time per token (a third, unprofiled generation), GPU kernel time and their difference, which
  is time the GPU sat idle between kernels (launch gaps, host waits);
- the time some kernel was on the GPU (the union of the kernels' intervals) and the wall's rest:
  the idle figure that holds under programmatic dependent launch, where a kernel starts before
  its predecessor ends and counts its wait as its own time, so that the kernels' sum exceeds the
  wall;
- the number of kernels, their time by family (GEMM, attention, Triton, copies), and the slowest.

With --ahead N,M..., the wall time (and so the idle time) is measured once for each number of
decode steps the engine queues ahead of the host (decode_engine.STEPS_AHEAD), in turns.

usage: python scripts/decode_profile.py PKG_DIR... [--prompt-tokens 512] [--steps 64] [--top 25]
       [--ahead 1,2,4] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
import warnings
from pathlib import Path

FAMILIES = (
    ("attention", ("fmha", "flash", "attention", "cudnn", "sdpa", "efficient")),
    ("gemm", ("gemm", "gemv", "nvjet", "xmma", "cutlass", "cublas", "splitk", "triton_tem")),
    ("triton_reduction", ("triton_red", "triton_per")),
    ("triton_pointwise", ("triton_poi",)),
    ("copy", ("memcpy", "memset", "copy", "fill")),
)


def family(kernel: str) -> str:
    name = kernel.lower()
    return next((f for f, marks in FAMILIES if any(m in name for m in marks)), "other")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals: time some kernel was on the GPU, two
    overlapping kernels counted once. busy_us([(0, 2), (1, 3), (5, 6)]) == 4."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def kernels_of(package, ids, new_tokens: int) -> tuple[dict[str, list[float]], float]:
    """({kernel name: [µs of each launch]}, µs some kernel was on the GPU) of one greedy
    generation of `new_tokens` tokens."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        package.generate(ids, max_new_tokens=new_tokens, eos_token_ids=[])
        torch.cuda.synchronize()
    launches: dict[str, list[float]] = collections.defaultdict(list)
    intervals = []
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            launches[event.name].append(event.device_time)
            intervals.append((event.time_range.start, event.time_range.end))
    return launches, busy_us(intervals)


def profile_package(folder: Path, args) -> dict:
    import torch

    import aotc_runtime

    package = aotc_runtime.load(folder)
    vocab = package.manifest.generation.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, args.prompt_tokens), generator=g)
    steps = args.steps
    with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        package.generate(ids, max_new_tokens=steps + 1, eos_token_ids=[])  # captures the graph
        torch.cuda.synchronize()
    # whether the decode step replays as a CUDA graph, and why not: a failed capture warns once
    graph = getattr(package, "_decode_graph", None)
    captured = sorted(graph.captured_modes) if graph is not None else None
    capture_warnings = [str(w.message)[:300] for w in caught]
    from aotc_runtime import decode_engine

    default_ahead = decode_engine.STEPS_AHEAD
    walls: dict[int, list[float]] = {n: [] for n in args.ahead or [default_ahead]}
    with torch.inference_mode():
        try:
            for _ in range(args.rounds):  # each setting in turn, round after round
                for ahead, times in walls.items():
                    decode_engine.STEPS_AHEAD = ahead
                    started = time.perf_counter()
                    package.generate(ids, max_new_tokens=1, eos_token_ids=[])
                    torch.cuda.synchronize()
                    prefill = time.perf_counter() - started
                    started = time.perf_counter()
                    package.generate(ids, max_new_tokens=steps + 1, eos_token_ids=[])
                    torch.cuda.synchronize()
                    times.append((time.perf_counter() - started - prefill) / steps)
        finally:
            decode_engine.STEPS_AHEAD = default_ahead
        wall_by_ahead = {n: statistics.median(times) * 1e3 for n, times in walls.items()}
        wall_ms = (
            wall_by_ahead[default_ahead] if default_ahead in walls else min(wall_by_ahead.values())
        )
        short, short_busy = kernels_of(package, ids, 1)
        long, long_busy = kernels_of(package, ids, steps + 1)
    busy_ms = (long_busy - short_busy) / steps / 1e3
    per_step: dict[str, tuple[float, float]] = {}  # name -> (µs per step, launches per step)
    for name, times in long.items():
        extra_us = sum(times) - sum(short.get(name, ()))
        extra_n = len(times) - len(short.get(name, ()))
        if extra_n > 0:
            per_step[name] = (extra_us / steps, extra_n / steps)
    kernel_ms = sum(us for us, _ in per_step.values()) / 1e3
    families: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, float] = collections.defaultdict(float)
    for name, (us, n) in per_step.items():
        families[family(name)] += us
        counts[family(name)] += n
    record = {
        "package": str(folder),
        "precision": package.manifest.precision,
        "prompt_tokens": args.prompt_tokens,
        "steps": steps,
        "wall_ms_per_step": round(wall_ms, 4),
        "kernel_ms_per_step": round(kernel_ms, 4),
        "idle_ms_per_step": round(wall_ms - kernel_ms, 4),
        "busy_ms_per_step": round(busy_ms, 4),  # some kernel on the GPU (overlaps once)
        "idle_of_busy_ms_per_step": round(wall_ms - busy_ms, 4),
        "by_steps_ahead": {
            str(n): {"wall_ms_per_step": round(w, 4), "idle_ms_per_step": round(w - kernel_ms, 4)}
            for n, w in wall_by_ahead.items()
        },
        "kernels_per_step": round(sum(n for _, n in per_step.values()), 1),
        "decode_graph_modes": captured,
        "warnings": capture_warnings,
        "families_us_per_step": {
            k: [round(v, 1), round(counts[k], 1)]
            for k, v in sorted(families.items(), key=lambda kv: -kv[1])
        },
        "top_kernels": [
            [round(us, 2), round(n, 2), name[:140]]
            for name, (us, n) in sorted(per_step.items(), key=lambda kv: -kv[1][0])[: args.top]
        ],
    }
    print(f"\n{folder}: {wall_ms:.3f} ms a step, {kernel_ms:.3f} ms of it in "
          f"{record['kernels_per_step']} kernels, idle {wall_ms - kernel_ms:.3f} ms")  # fmt: skip
    print(f"  some kernel on the GPU {busy_ms:.3f} ms a step (overlaps counted once): idle "
          f"{wall_ms - busy_ms:.3f} ms, {(wall_ms - busy_ms) / wall_ms:.1%} of the step")  # fmt: skip
    print(f"  decode graph modes captured: {captured}; warnings: {capture_warnings}")
    for n, w in wall_by_ahead.items():
        print(f"  {n} step(s) queued ahead: {w:.3f} ms a step, idle {w - kernel_ms:.3f} ms")
    for fam, (us, n) in record["families_us_per_step"].items():
        print(f"  {fam:18s} {us:9.1f} µs  ({n} launches)")
    for us, n, name in record["top_kernels"]:
        print(f"  {us:9.2f} µs x{n:<5} {name}")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--ahead",
        type=lambda text: [int(n) for n in text.split(",")],
        help="numbers of decode steps queued ahead of the host to time, e.g. 1,2,4",
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed generations per setting")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        parser.error("this profiles CUDA kernels: run it on a GPU machine")
    records = [profile_package(folder, args) for folder in args.packages]
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name()}
        args.json.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
