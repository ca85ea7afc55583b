"""aotc::fused_gemv_cuda: a decode step's weight product with what surrounds it in a layer, one
launch instead of three.

At batch 1 a product of a small language model reads a megabyte or two, which takes the memory
well under a microsecond; what it costs is its launch, and the launches of the RMSNorm before it
and the residual add after it (SmolLM2-135M's step on an H200: 366 kernels, 12 a layer, none of
them long; docs/benchmarks.md). This kernel does the three in one:

- prologue, on the activations as they are loaded: the RMSNorm of each row (its mean square taken
  in a first pass over the row, which every program reads anyway) times the norm's weight, or the
  gated MLP's silu(gate) * up from the stacked gate/up product's output; then the clamp and cast
  to the weight's dtype that a reduced-precision build puts before the product;
- the product: BLOCK_N output features a program, the weight tile as the tensor cores' left
  operand and BLOCK_M = 16 rows of activations the right (the layout of gemv.py's quantized
  products), accumulated in fp32 over the input features;
- epilogue: the bias, the rounding to the weight's dtype that the unfused product's output has,
  and the residual added in the residual's precision.

Each step rounds where the unfused program rounds (aotc/export/fused_products.py's `reference`
is that program), so a fused package computes what the unfused one does, up to the order of the
sums. No split of the input features: the epilogue needs a row's whole sum, so small matrices take
narrow tiles instead, enough programs to cover the GPU.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

OP = "aotc::fused_gemv_cuda"
BLOCK_M = 16  # the smallest tensor-core tile; decode's rows are masked into it
MAX_ROWS = 16  # more rows than this take the unfused program (cuBLAS reads the weight once)


@triton.jit
def _fused_gemv_kernel(
    x_ptr, w_ptr, b_ptr, norm_ptr, res_ptr, out_ptr, rows, n_out, x_stride, eps, clamp,
    K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr, CLAMP: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = n < n_out
    m_ok = m < rows
    x_dtype = x_ptr.dtype.element_ty
    w_dtype = w_ptr.dtype.element_ty
    if NORM:  # each row's mean square, in fp32 as the unfused norm takes it
        squares = tl.zeros((BLOCK_M,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(
                x_ptr + m[None, :] * x_stride + k[:, None],
                mask=m_ok[None, :] & (k < K)[:, None],
                other=0.0,
            ).to(tl.float32)
            squares += tl.sum(xk * xk, axis=0)
        inverse_rms = 1.0 / tl.sqrt(squares / K + eps)
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        mask = m_ok[None, :] & k_ok[:, None]
        a = tl.load(x_ptr + m[None, :] * x_stride + k[:, None], mask=mask, other=0.0)
        if GATED:  # silu(gate) * up, each rounded to the activations' dtype as the graph does
            gate = a.to(tl.float32)
            up = tl.load(x_ptr + m[None, :] * x_stride + K + k[:, None], mask=mask, other=0.0)
            silu = (gate / (1.0 + tl.exp(-gate))).to(x_dtype)
            a = (silu.to(tl.float32) * up.to(tl.float32)).to(x_dtype)
        a = a.to(tl.float32)
        if NORM:
            weight = tl.load(norm_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            a = weight[:, None] * (a * inverse_rms[None, :])
        if CLAMP:
            a = tl.minimum(tl.maximum(a, -clamp), clamp)
        a = a.to(w_dtype)
        w = tl.load(
            w_ptr + n[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0
        )
        if IEEE:  # fp32 packages: exact fp32 products, not TF32
            acc = tl.dot(w, a, acc, input_precision="ieee")
        else:
            acc = tl.dot(w, a, acc)
    if BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    y = acc.to(w_dtype)  # the unfused product's output
    out_mask = n_ok[:, None] & m_ok[None, :]
    if RESIDUAL:
        r = tl.load(res_ptr + m[None, :] * n_out + n[:, None], mask=out_mask, other=0.0)
        out = r.to(tl.float32) + y.to(tl.float32)
    else:
        out = y
    tl.store(out_ptr + m[None, :] * n_out + n[:, None], out, mask=out_mask)


@functools.cache
def _streaming_multiprocessors(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_shape(n_out: int, k_in: int, programs_wanted: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K): the widest tile of output features (64, 32 or 16) that still gives
    `programs_wanted` programs (one per SM), else the narrowest; input features 128 at a time,
    fewer for a narrower layer."""
    block_n = next((b for b in (64, 32) if triton.cdiv(n_out, b) >= programs_wanted), 16)
    block_k = min(128, max(16, triton.next_power_of_2(k_in)))
    return block_n, block_k


def fused_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    gated: bool,
    clamp: float,
    launch=lambda k: k,
) -> torch.Tensor:
    """x [rows, K] (or [rows, 2K] gate then up when `gated`), weight [N, K]: the fused product
    [rows, N], in the residual's and the weight's promoted dtype when there is a residual [rows,
    N], else in the weight's. `clamp` 0: no clamp."""
    rows = x.shape[0]
    n_out, k_in = weight.shape
    out_dtype = (
        torch.promote_types(residual.dtype, weight.dtype) if residual is not None else weight.dtype
    )
    out = torch.empty((rows, n_out), dtype=out_dtype, device=x.device)
    block_n, block_k = launch_shape(n_out, k_in, _streaming_multiprocessors(x.device.index or 0))
    grid = (triton.cdiv(n_out, block_n), triton.cdiv(rows, BLOCK_M))
    # an absent operand's pointer is the weight's: the kernel never reads it (its flag is off)
    launch(_fused_gemv_kernel)[grid](
        x, weight, weight if bias is None else bias, weight if norm_weight is None else norm_weight,
        weight if residual is None else residual, out, rows, n_out, x.stride(0), eps, clamp,
        K=k_in, NORM=norm_weight is not None, GATED=gated, BIAS=bias is not None,
        RESIDUAL=residual is not None, CLAMP=clamp > 0, IEEE=weight.dtype == torch.float32,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=3,
    )  # fmt: skip
    return out


@triton_op(OP, mutates_args={})
def fused_gemv_cuda(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    gated: bool,
    clamp: float,
) -> torch.Tensor:
    """The fused product (fused_gemv) of at most MAX_ROWS rows, compiled into the package."""
    return fused_gemv(x, weight, bias, norm_weight, residual, eps, gated, clamp, launch=wrap_triton)
