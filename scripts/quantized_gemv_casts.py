"""Does converting int8 to bf16 bound the int8 GEMV? aotc/kernels/gemv.py's tile timed with
three conversions of the weight: the plain cast (int8 -> fp32 -> bf16), an fp32 magic-number cast
(the int8 added into the mantissa of 2^23, then 2^23 + 128 subtracted: integer and float adds in
place of the quarter-rate int-to-float conversion) and an fp16 magic-number cast (the same in
fp16's mantissa, with fp16 activations). One row, weights read from memory (each timed call reads
the next of enough copies to pass 512 MB), the best tile of a small sweep for each.
Raw: docs/bench/quantized_gemv_casts_h100.json.

usage: python scripts/quantized_gemv_casts.py OUT.json   (on a CUDA machine, aotc installed)
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl
from quantized_gemv_sweep import cold_weights, time_rotated

from aotc.kernels.gemv import split_count

SHAPES = ((2048, 3072), (2048, 16384), (8192, 2048), (2048, 128256))  # K x N
CASTS = {0: "plain cast", 1: "fp32 magic number", 2: "fp16 magic number, fp16 activations"}


@triton.jit
def _kernel(
    x_ptr, w_ptr, out_ptr, rows, n_out, k_per_split, K: tl.constexpr, CAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = n < n_out
    m_ok = m < rows
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    start = split * k_per_split
    for k0 in range(start, start + k_per_split, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(
            x_ptr + m[None, :] * K + k[:, None], mask=m_ok[None, :] & k_ok[:, None], other=0.0
        )
        w = tl.load(
            w_ptr + n[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0
        )
        if CAST == 0:
            w = w.to(x.dtype)
        elif CAST == 1:  # 0x4B000080 + w is the float 2^23 + 128 + w
            w = ((w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0).to(x.dtype)
        else:  # 0x6480 + w is the half 1024 + 128 + w
            w = (w.to(tl.int16) + 0x6480).to(tl.int16).to(tl.float16, bitcast=True) - 1152.0
        acc = tl.dot(w, x, acc)
    out = out_ptr + split * rows * n_out + m[None, :] * n_out + n[:, None]
    tl.store(out, acc, mask=n_ok[:, None] & m_ok[None, :])


def product(x, w, cast, block_n, block_k, splits, warps, stages):
    rows, k_in = x.shape
    n_out = w.shape[0]
    per_split = triton.cdiv(triton.cdiv(k_in, block_k), splits) * block_k
    splits = triton.cdiv(k_in, per_split)
    out = torch.empty((splits, rows, n_out), dtype=torch.float32, device=x.device)
    _kernel[(triton.cdiv(n_out, block_n), splits, 1)](
        x, w, out, rows, n_out, per_split, K=k_in, CAST=cast, BLOCK_M=16, BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = {"device": torch.cuda.get_device_name()}
    for k_in, n_out in SHAPES:
        weights, dense = cold_weights(n_out, k_in)
        x = torch.randn(1, k_in, device="cuda", dtype=torch.bfloat16)
        inputs = {0: x, 1: x, 2: x.half()}
        row = {"bf16": time_rotated([lambda w=w, x=x: x @ w.t() for w in dense])}
        plain = product(x, weights[0], 0, 64, 256, 1, 4, 3).sum(0)
        for cast in (1, 2):  # both casts are exact: the products equal the plain cast's
            got = product(inputs[cast], weights[0], cast, 64, 256, 1, 4, 3).sum(0)
            row[f"err{cast}"] = float((got - plain).abs().max() / plain.abs().max())
        for cast in CASTS:
            best = None
            for block_n in (64, 128):
                for block_k in (128, 256):
                    for per_sm in (1, 2, 4):
                        splits = split_count(n_out, k_in, block_n, block_k, per_sm * sms)
                        for warps, stages in ((4, 3), (4, 4)):
                            shape = (cast, block_n, block_k, splits, warps, stages)
                            calls = [
                                lambda w=w, a=inputs[cast], s=shape: product(a, w, *s)
                                for w in weights
                            ]
                            took = time_rotated(calls)
                            key = f"{block_n}_{block_k}_{per_sm}_{warps}_{stages}"
                            if best is None or took < best[0]:
                                best = (took, key)
            row[f"mode{cast}"] = best
        print(k_in, n_out, row, flush=True)
        results[f"{k_in}x{n_out}"] = row
    with open(sys.argv[1], "w") as out:
        json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
