"""Programmatic dependent launch (Hopper's PDL), measured on a decode step's chain of fused products.

A batch-1 decode step of a small model is a chain of short kernels, each waiting for the one
before it: on an H200 SmolLM2-135M's fused products take 3.4 us each where their weights take
well under one to read (docs/benchmarks.md). With PDL a kernel is launched while its predecessor
runs, loads its weights, and waits (griddepcontrol.wait) only before it reads the activations the
predecessor writes (aotc/kernels/fused_gemv.py, `pdl=True`).

This script runs the step's products as a model's layers chain them (norm into q/k/v; o with the
residual, reading q/k/v's first columns in place of the attention's output; norm
into gate/up; the gated down projection with the residual; the final norm into the output layer),
every layer on its own weights so they come from memory, not L2, captured once into a CUDA graph
with and once without PDL. It reports the median step and per-product time over the replays, and
checks that both chains give the same bits.

    python scripts/pdl_chain.py --shape smollm2 --shape llama-1b --out pdl_chain.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotc.kernels.fused_gemv import fused_gemv  # noqa: E402

# hidden, q/k/v outputs, attention output (o's input), intermediate, layers, vocabulary
SHAPES = {
    "smollm2": (576, 960, 576, 1536, 30, 49152),
    "llama-1b": (2048, 3072, 2048, 8192, 16, 128256),
    "qwen3-0.6b": (1024, 4096, 2048, 3072, 28, 151936),
}


def chain(shape: str, seed: int = 0):
    """The step's weights and a closure that runs its products once (a given `pdl`)."""
    hidden, qkv, attended, inter, layers, vocab = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(seed)

    def weight(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)

    def norm() -> torch.Tensor:
        return (torch.rand(hidden, device="cuda", generator=g) + 0.5).to(torch.bfloat16)

    stack = [
        (weight(qkv, hidden), norm(), weight(hidden, attended), weight(2 * inter, hidden), norm(),
         weight(hidden, inter))
        for _ in range(layers)
    ]  # fmt: skip
    head, final = weight(vocab, hidden), norm()
    x0 = torch.randn(1, hidden, device="cuda", generator=g).to(torch.bfloat16)
    eps = 1e-5

    def step(pdl: bool) -> torch.Tensor:
        h = x0
        for wqkv, n1, wo, wgu, n2, wd in stack:
            q = fused_gemv(h, wqkv, None, n1, None, eps, False, 0.0, pdl=pdl)
            h = fused_gemv(q[:, :attended], wo, None, None, h, eps, False, 0.0, pdl=pdl)
            gu = fused_gemv(h, wgu, None, n2, None, eps, False, 0.0, pdl=pdl)
            h = fused_gemv(gu, wd, None, None, h, eps, True, 0.0, pdl=pdl)
        return fused_gemv(h, head, None, final, None, eps, False, 0.0, pdl=pdl)

    weight_bytes = sum(t.numel() * t.element_size() for layer in stack for t in layer)
    weight_bytes += head.numel() * head.element_size()
    return step, 4 * layers + 1, weight_bytes


def graph_times(step, pdl: bool, replays: int) -> tuple[list[float], torch.Tensor]:
    """Seconds of each replay of the step captured into one CUDA graph, and its output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(pdl)  # Triton compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(pdl)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times, out.clone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if torch.cuda.get_device_capability()[0] < 9:
        parser.error("programmatic dependent launch needs compute capability 9.0 or later")
    from aotc.bench.generation import copy_bandwidth

    bandwidth = copy_bandwidth()
    records = []
    for shape in args.shape or ["smollm2"]:
        step, kernels, weight_bytes = chain(shape)
        record = {"shape": shape, "kernels": kernels, "weight_mb": round(weight_bytes / 1e6, 1)}
        outputs = {}
        for pdl in (False, True):
            times, outputs[pdl] = graph_times(step, pdl, args.replays)
            name = "pdl" if pdl else "plain"
            median = statistics.median(times)
            record[f"{name}_step_us"] = round(median * 1e6, 1)
            record[f"{name}_p90_step_us"] = round(sorted(times)[int(0.9 * len(times))] * 1e6, 1)
            record[f"{name}_per_kernel_us"] = round(median * 1e6 / kernels, 2)
            record[f"{name}_fraction_of_copy_bandwidth"] = round(
                weight_bytes / median / bandwidth, 3
            )
        record["same_bits"] = bool(torch.equal(outputs[False], outputs[True]))
        record["pdl_speedup"] = round(record["plain_step_us"] / record["pdl_step_us"], 3)
        print(json.dumps(record), flush=True)
        records.append(record)
    if args.out:
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1),
            "replays": args.replays,
        }
        args.out.write_text(json.dumps({"meta": meta, "records": records}, indent=2) + "\n")


if __name__ == "__main__":
    main()
