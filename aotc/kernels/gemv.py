"""aotc::quantized_gemv_cuda: the product of an int8 or fp8 weight on CUDA, a Triton kernel compiled
into the package (AOTInductor compiles user Triton kernels registered through
`torch.library.triton_op`, as for attention), so the runtimes need nothing new.

At one to sixteen rows a product reads its weight once and does little else, so what counts is
reading the stored bytes at the memory's bandwidth. Each program takes BLOCK_N output features and
a stretch of the input features, loads that weight tile once as int8 or fp8, converts it to the
activations' dtype in registers and multiplies it with BLOCK_M = 16 activation rows on the tensor
cores (`tl.dot`, the weight as the left operand: small-M GEMMs swap A and B the same way);
rows past the last are masked to zero, so decode's single row costs the same weight read. This is
the mixed-input tile of W8A16 kernels (vLLM's Triton and Marlin kernels keep M at 16 for decode).
The first form, a broadcast product over [rows, N, K] reduced with `tl.sum`, two rows a program,
took 7.2 ms of a 1B model's 7.8 ms decode step on an H200: Triton lays that 3-D tile out badly
(alone, it ran 2x slower at two rows a program than at one, 10x at eight). The feature count is a
compile-time constant here, so the weight's addresses are known aligned and its loads vectorize.
A small matrix splits its input features (split-K) until the grid
fills the GPU; the caller adds the splits' fp32 partial sums, where Inductor fuses the sum with the
per-row scale and the cast. A prefill of R rows reads the weight R / 16 times.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

OP = "aotc::quantized_gemv_cuda"
BLOCKS_OP = "aotc::scaled_gemv_cuda"  # fp8's weights, scaled per block of input features
BLOCK_M = 16  # the smallest tensor-core tile; decode's rows are masked into it


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, rows, n_out, k_per_split,
    K: tl.constexpr, IEEE: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """SCALE_BLOCK 0: the raw products (the caller scales each output row); else the weight has a
    scale per output feature and SCALE_BLOCK input features ([N, K / SCALE_BLOCK] fp32), which
    BLOCK_K equals: each block's product is scaled in fp32 as it is added."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = n < n_out
    m_ok = m < rows
    # the product transposed, weight tile times activations [BLOCK_N, BLOCK_M]: the weight is the
    # tensor cores' left operand, loaded as stored (features contiguous), the few rows the right
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    start = split * k_per_split
    for k0 in range(start, start + k_per_split, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(
            x_ptr + m[None, :] * K + k[:, None], mask=m_ok[None, :] & k_ok[:, None], other=0.0
        )
        # no `other`: fp8 has no literal zero, so the masked features are zeroed after the cast
        w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :])
        w = tl.where(k_ok[None, :], w.to(x.dtype), 0.0).to(x.dtype)
        if SCALE_BLOCK:
            if IEEE:  # fp32 packages: exact fp32 products, not TF32
                part = tl.dot(w, x, input_precision="ieee")
            else:
                part = tl.dot(w, x)
            scale = tl.load(
                s_ptr + n * (K // SCALE_BLOCK) + k0 // SCALE_BLOCK, mask=n_ok, other=0.0
            )
            acc += part * scale[:, None]
        elif IEEE:  # fp32 packages: exact fp32 products, not TF32
            acc = tl.dot(w, x, acc, input_precision="ieee")
        else:
            acc = tl.dot(w, x, acc)
    out = out_ptr + split * rows * n_out + m[None, :] * n_out + n[:, None]
    tl.store(out, acc, mask=n_ok[:, None] & m_ok[None, :])


@functools.cache
def streaming_multiprocessors(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_shape(
    n_out: int, k_in: int, programs_wanted: int, scale_block: int = 0
) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, blocks of output features, splits of the input features). A grid with
    fewer programs than `programs_wanted` (two per SM) splits its input features, each split at
    least one BLOCK_K. The tile is the best or within 3% of the best of a sweep over the
    Llama-3.2-1B shape's products, one row, weights not in L2, on an H200 (docs/quantization.md).
    A weight with a scale per `scale_block` input features reads one such block per step."""
    block_n = 64
    block_k = scale_block or min(256, max(16, triton.next_power_of_2(k_in)))
    splits = split_count(n_out, k_in, block_n, block_k, programs_wanted)
    return block_n, block_k, triton.cdiv(n_out, block_n), splits


def split_count(n_out: int, k_in: int, block_n: int, block_k: int, programs_wanted: int) -> int:
    """How many stretches of the input features a tile of block_n x block_k splits into: one if
    the output features alone give `programs_wanted` programs, else enough to reach it (each at
    least one block_k), counted after rounding each stretch up to whole blocks."""
    blocks_n = triton.cdiv(n_out, block_n)
    k_blocks = triton.cdiv(k_in, block_k)
    splits = (
        1 if blocks_n >= programs_wanted else min(k_blocks, triton.cdiv(programs_wanted, blocks_n))
    )
    return triton.cdiv(k_in, triton.cdiv(k_blocks, splits) * block_k)


def partial_products(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, launch=lambda k: k
) -> torch.Tensor:
    """Partial sums [splits, rows, N] (fp32) of x [rows, K] (contiguous) times weight [N, K] (int8
    or fp8, contiguous) transposed, each block scaled by `scale` [N, K / block] when given."""
    rows, k_in = x.shape
    n_out = weight.shape[0]
    scale_block = k_in // scale.shape[1] if scale is not None else 0
    programs = 2 * streaming_multiprocessors(x.device.index or 0)
    block_n, block_k, blocks_n, splits = launch_shape(n_out, k_in, programs, scale_block)
    per_split = triton.cdiv(triton.cdiv(k_in, block_k), splits) * block_k
    out = torch.empty((splits, rows, n_out), dtype=torch.float32, device=x.device)
    # without scales the kernel reads no scale pointer (SCALE_BLOCK 0): the weight stands in
    launch(_gemv_kernel)[(blocks_n, splits, triton.cdiv(rows, BLOCK_M))](
        x, weight, weight if scale is None else scale, out, rows, n_out, per_split,
        K=k_in, IEEE=x.dtype == torch.float32, SCALE_BLOCK=scale_block,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=3,
    )  # fmt: skip
    return out


@triton_op(OP, mutates_args={})
def quantized_gemv_cuda(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Partial sums [splits, rows, N] (fp32) of x [rows, K] (contiguous) times weight [N, K] (int8
    or fp8, contiguous) transposed; the caller adds the splits and applies the scales."""
    return partial_products(x, weight, None, launch=wrap_triton)


@triton_op(BLOCKS_OP, mutates_args={})
def scaled_gemv_cuda(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """As quantized_gemv_cuda, each [1, K / blocks] block of the weight scaled by `scale` [N,
    blocks] (fp32) inside the kernel; the caller adds the splits."""
    return partial_products(x, weight, scale, launch=wrap_triton)


def rows_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [rows, K] @ (weight * scale[:, None]).T in x's dtype."""
    partial = torch.ops.aotc.quantized_gemv_cuda(x.contiguous(), weight.contiguous())
    return (partial.sum(0) * scale.float()).to(x.dtype)


def blocks_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [rows, K] @ (weight scaled per block by scale [N, blocks]).T in x's dtype."""
    partial = torch.ops.aotc.scaled_gemv_cuda(
        x.contiguous(), weight.contiguous(), scale.float().contiguous()
    )
    return partial.sum(0).to(x.dtype)
