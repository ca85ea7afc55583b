"""Timing GPU work as a decode step runs it: captured into one CUDA graph and replayed, so that
launch overhead from the host is out of the figure. The build's tile choice (tile_timing.py)
and the kernel benchmarks in scripts/ time their kernels this way."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def replay_seconds(step: Callable[[], object], replays: int, device=None) -> list[float]:
    """Seconds of each of `replays` replays of `step()` captured into one CUDA graph on `device`
    (the current one by default). `step` runs once first on a side stream, so that Triton and
    Inductor compile outside the capture."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    times = []
    for _ in range(replays):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return times
