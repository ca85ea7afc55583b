"""Shared by the benchmark scripts: interleaved steady-state timing, fresh-process cold starts, GPU profiles.

Interleaving (a slice of calls of each contender in turn, for several rounds, the order rotated
each round) makes machine drift hit every contender alike; all figures are medians and percentiles.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from types import SimpleNamespace

import torch

from aotc_runtime.timing import summarize, synchronize, time_calls


def interleaved(contenders: dict, inputs: list, device: torch.device, iters: int, warmup: int = 10, rounds: int = 10) -> dict:
    """{name: latency summary + first_call_ms} for callables `fn(*inputs)`, measured in one process.

    The timed rounds are `aotc bench`'s own (aotc.bench.interleaved); this adds the first call and
    the warm-up of each callable before them.
    """
    from aotc.bench import interleaved as timed_rounds

    first_call = {}
    with torch.inference_mode():
        for name, fn in contenders.items():
            started = time.perf_counter()
            fn(*inputs)
            synchronize(device)
            first_call[name] = (time.perf_counter() - started) * 1e3
            time_calls(lambda: fn(*inputs), 0, device, warmup=warmup)
        timed = [SimpleNamespace(name=name, call=fn) for name, fn in contenders.items()]
        samples = timed_rounds(timed, inputs, iters, rounds, device, _NoBar(), "")
    return {name: {**summarize(s), "first_call_ms": first_call[name]} for name, s in samples.items()}


class _NoBar:
    def step(self, _text: str) -> None:
        pass


def gpu_events(fn, inputs, calls: int = 20) -> list:
    """The profiler's GPU events (kernels and copies) of `calls` calls of `fn(*inputs)`, after one untimed call.

    Their `device_time` is in microseconds. The untimed call compiles, or captures a CUDA graph, so
    what is profiled is the steady state.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        fn(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*inputs)
            torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == DeviceType.CUDA]


def cold_starts(commands: dict, runs: int, env=None) -> dict:
    """Wall seconds of fresh processes (start to exit after the first output), alternated per run."""
    times = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=env)
            times[name].append(time.perf_counter() - started)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "runs": len(t)} for name, t in times.items()}


def print_table(steady: dict, cold: dict) -> None:
    print(f"{'contender':36} {'median ms':>10} {'p90 ms':>8} {'p99 ms':>8} {'first call ms':>14}")
    for name, stats in steady.items():
        print(f"{name:36} {stats['median_ms']:10.3f} {stats['p90_ms']:8.3f} {stats['p99_ms']:8.3f} {stats['first_call_ms']:14.1f}")
    for name, stats in cold.items():
        print(f"cold start  {name:44} median {stats['median_s']:.2f} s (min {stats['min_s']:.2f} s, {stats['runs']} runs)")
