"""The int8 GEMV's tile and split-K against bf16's product, one row, with the weights read from
memory and not from L2 (each timed call reads the next of enough copies to pass 512 MB): the sweep
that chose aotc/kernels/gemv.py's launch shape. Raw: docs/bench/quantized_gemv_sweep_h200.json.

usage: python scripts/quantized_gemv_sweep.py [--out OUT.json]   (on a CUDA machine)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton

from aotc.kernels import gemv as gemv_kernel

SHAPES = ((2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048), (2048, 128256))  # K x N


def product(x, w, block_n, block_k, splits, warps, stages):
    rows, k_in = x.shape
    n_out = w.shape[0]
    per_split = triton.cdiv(triton.cdiv(k_in, block_k), splits) * block_k
    splits = triton.cdiv(k_in, per_split)
    out = torch.empty((splits, rows, n_out), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n_out, block_n), splits, triton.cdiv(rows, gemv_kernel.BLOCK_M))
    gemv_kernel._gemv_kernel[grid](
        x, w, out, rows, n_out, per_split, K=k_in, IEEE=False, BLOCK_M=gemv_kernel.BLOCK_M,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def cold_weights(n_out: int, k_in: int) -> tuple[list, list]:
    """(int8 weights, bf16 weights) [n_out, k_in], enough copies of each to pass 512 MB, so a call
    that takes the next copy reads it from memory and not from L2."""
    copies = max(2, -(-(512 << 20) // (n_out * k_in * 2)))
    weights = [
        torch.randint(-127, 127, (n_out, k_in), dtype=torch.int8, device="cuda")
        for _ in range(copies)
    ]
    dense = [torch.randn(n_out, k_in, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    return weights, dense


def time_rotated(calls, reps: int = 40) -> float:
    """µs a call (median of 5 replays of a CUDA graph of `reps` calls taken in turn)."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            calls[i % len(calls)]()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) / reps * 1e6)
    return round(sorted(times)[2], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = {}
    for k_in, n_out in SHAPES:
        weights, dense = cold_weights(n_out, k_in)
        x = torch.randn(1, k_in, device="cuda", dtype=torch.bfloat16)
        row = {"bf16": time_rotated([lambda w=w, x=x: x @ w.t() for w in dense])}
        for block_n in (32, 64, 128):
            for block_k in (64, 128, 256, 512):
                for per_sm in (1, 2, 4, 8):
                    splits = gemv_kernel.split_count(n_out, k_in, block_n, block_k, per_sm * sms)
                    for warps, stages in ((4, 3), (4, 4), (8, 3), (4, 5)):
                        shape = (block_n, block_k, splits, warps, stages)
                        calls = [lambda w=w, x=x, s=shape: product(x, w, *s) for w in weights]
                        row["_".join(map(str, (block_n, block_k, per_sm, warps, stages)))] = (
                            time_rotated(calls)
                        )
        best = min((v, k) for k, v in row.items() if k != "bf16")
        gb = n_out * k_in / 1e9
        print(f"{k_in}x{n_out}: bf16 {row['bf16']} µs ({2 * gb / row['bf16'] * 1e3:.2f} TB/s), "
              f"int8 best {best[1]} {best[0]} µs ({gb / best[0] * 1e3:.2f} TB/s)")  # fmt: skip
        results[f"{k_in}x{n_out}"] = row
    if args.out:
        meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name()}
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
