"""aotc::quantized_gemv_cuda: the decode product of an int8 or fp8 weight on CUDA, a Triton kernel
compiled into the package (AOTInductor compiles user Triton kernels registered through
`torch.library.triton_op`, as for attention), so the runtimes need nothing new.

At one to eight rows a product reads its weight once and does little else, so what counts is
reading the stored bytes at the memory's bandwidth. Inductor's own reduction over
`x * w.to(bf16)` reached 1.1-2.0 TB/s of int8 on the H100 and slowed by 5-8x at eight rows (each row
re-read the weight); torch's `_weight_int8pack_mm` reached 0.1-0.2 TB/s, and `torch._scaled_mm`
at one row spent more on quantizing the activations than on the product (docs/quantization.md).
Here one program takes BLOCK_N output rows and a stretch of the input features, reads that
weight tile once as int8 or fp8, converts it in registers, and multiplies it with block_m
activation rows (a third grid axis takes the next block_m); the stretches of one output row
(split-K) give a small matrix enough programs to fill the GPU, and their partial sums are added by
the caller, where Inductor fuses the sum with the per-row scale and the cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

OP = "aotc::quantized_gemv_cuda"
PROGRAMS = 1024  # enough programs to keep every SM's loads in flight (132 SMs on the H100)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, out_ptr, rows, n_out, k_in, k_per_split,
    x_sm, w_sn, o_ss, o_sm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = n < n_out
    m_ok = m < rows
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    start = split * k_per_split
    for k0 in range(start, start + k_per_split, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_in
        # no `other`: fp8 has no literal zero; the masked features are zeroed after the cast
        w = tl.load(w_ptr + n[:, None] * w_sn + k[None, :], mask=n_ok[:, None] & k_ok[None, :])
        w = tl.where(k_ok[None, :], w.to(tl.float32), 0.0)
        x_tile = x_ptr + m[:, None] * x_sm + k[None, :]
        x = tl.load(x_tile, mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    out = out_ptr + split * o_ss + m[:, None] * o_sm + n[None, :]
    tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])


# A program reads BLOCK_N output rows x (TILE // block_m) input features per step of its loop, and
# multiplies them with block_m activation rows: about TILE products per step whatever the rows.
BLOCK_N, TILE = 16, 8192


def launch_shape(n_out: int, k_in: int, block_m: int) -> tuple[int, int, int]:
    """(BLOCK_K, blocks of output rows, splits of the input features): enough splits that the
    grid holds about PROGRAMS programs, each at least one BLOCK_K long."""
    block_k = max(32, TILE // BLOCK_N // block_m)
    blocks_n = triton.cdiv(n_out, BLOCK_N)
    splits = max(1, min(PROGRAMS // blocks_n, triton.cdiv(k_in, block_k)))
    return block_k, blocks_n, splits


@triton_op(OP, mutates_args={})
def quantized_gemv_cuda(x: torch.Tensor, weight: torch.Tensor, block_m: int) -> torch.Tensor:
    """Partial sums [splits, rows, N] (fp32) of x [rows, K] times weight [N, K] (int8 or fp8)
    transposed, block_m rows a program; the caller adds the splits and applies the scales."""
    rows, k_in = x.shape
    n_out = weight.shape[0]
    block_k, blocks_n, splits = launch_shape(n_out, k_in, block_m)
    per_split = triton.cdiv(triton.cdiv(k_in, splits), block_k) * block_k
    out = torch.empty((splits, rows, n_out), dtype=torch.float32, device=x.device)
    wrap_triton(_gemv_kernel)[(blocks_n, splits, triton.cdiv(rows, block_m))](
        x, weight, out, rows, n_out, k_in, per_split,
        x.stride(0), weight.stride(0), out.stride(0), out.stride(1),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=block_k,
    )  # fmt: skip
    return out


def rows_gemv(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block_m: int = 1
) -> torch.Tensor:
    """x [rows, K] @ (weight * scale[:, None]).T in x's dtype."""
    partial = torch.ops.aotc.quantized_gemv_cuda(x.contiguous(), weight, block_m)
    return (partial.sum(0) * scale.float()).to(x.dtype)
