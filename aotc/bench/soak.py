"""Soak: many calls into one package, and many load/unload cycles, with memory sampled throughout.

What a long-lived server does to a package: calls it for hours (memory must stay flat) and reloads
it (hot swaps: what one load takes must come back at unload). RSS is split as Linux reports it:
anonymous memory (tensors, buffers, the runtime's own) and file-backed pages (mapped shared
objects). On CUDA the caching allocator's figures are sampled too.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import torch

MIB = 1 << 20


def memory_now(device: torch.device) -> dict:
    """RSS parts in MiB (Linux /proc/self/status), plus the CUDA allocator's on a GPU."""
    sample = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    sample[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        sample["cuda_allocated"] = torch.cuda.memory_allocated(device) / MIB
        sample["cuda_reserved"] = torch.cuda.memory_reserved(device) / MIB
    return sample


def growth(first: dict, last: dict) -> dict:
    return {key: round(last[key] - first[key], 2) for key in first if key in last}


def soak_calls(package, inputs: list, calls: int, samples: int = 20) -> dict:
    """`calls` calls after a warm-up; memory sampled `samples` times; growth from the first sample."""
    every = max(1, calls // samples)
    trace = []
    with torch.inference_mode():
        for _ in range(10):  # warm-up: allocator pools and CUDA graphs reach their steady size
            package(*inputs)
        gc.collect()
        trace.append(memory_now(package.device))
        started = time.perf_counter()
        for call in range(1, calls + 1):
            package(*inputs)
            if call % every == 0:
                trace.append(memory_now(package.device))
    seconds = time.perf_counter() - started
    return {
        "calls": calls,
        "seconds": round(seconds, 3),
        "growth_mib": growth(trace[0], trace[-1]),
        "max_growth_mib": {
            key: round(max(s[key] for s in trace) - trace[0][key], 2) for key in trace[0]
        },
    }


def load_unload_cycles(path: Path, cycles: int, inputs: list | None = None) -> dict:
    """Load the package, call it once, drop it; `cycles` times. Growth after the first cycle."""
    import aotc_runtime

    def cycle() -> torch.device:
        package = aotc_runtime.load(path)
        device = package.device
        args = inputs or package.signature.random_inputs(seed=0, device=device)
        with torch.inference_mode():
            package(*args)
        del package
        gc.collect()
        return device

    device = cycle()
    first = memory_now(device)
    started = time.perf_counter()
    for _ in range(cycles):
        cycle()
    total = growth(first, memory_now(device))
    return {
        "cycles": cycles,
        "seconds": round(time.perf_counter() - started, 3),
        "growth_mib": total,
        "per_cycle_mib": {key: round(value / cycles, 3) for key, value in total.items()},
    }
