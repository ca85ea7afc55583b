"""aotc::fused_rows_gemm_cuda: the fused product (fused_gemv.py's: the norm or activation before
it, the residual add after it) for 5 to ROWS rows, each weight tile read once for all of them.

fused_gemv.py's kernel gives each row its own programs, which read the whole weight again (from
L2 at best): right for decode's one to four rows, and behind cuBLAS above them. Above them a fused
package used to run the unfused products in a branch of their own (fused_products.fused_linear),
where the norm before and the residual add after could not fuse with their neighbours: at the 1B
shape's batch 8 on an H200 that step was 3.5% slower than the same package without the fusion
(docs/benchmarks.md). Here a program takes BLOCK_N output features for up to BLOCK_R (16) rows:

- the rows' norm statistics first (mean square, or mean and variance), a pass over their inputs;
- then, block by block of the input features, the weight tile [BLOCK_N, BLOCK_K] and the rows'
  operand tile [BLOCK_R, BLOCK_K] through the prologue (fused_gemv._operand, on a tile as on a row)
  multiplied on the tensor cores into an fp32 accumulator [BLOCK_R, BLOCK_N], the loads of the
  next blocks in flight while one is multiplied (num_stages);
- the epilogue of fused_gemv's kernel, per row: the int8 rows' scale or fp8's block scales, the
  bias, the rounding to the product's dtype, the residual.

Every step rounds where the unfused program rounds, as in fused_gemv's kernel; the products of
bf16 or fp16 operands are exact in fp32, fp32 ones are multiplied as IEEE fp32, not TF32. Rows past
the step's count (a program's last block of rows) load zeros and store nothing.

Not yet the default (fused_products.ROWS_KERNEL): measured on a GPU before it replaces the unfused
branch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from aotc.kernels.fused_gemv import OPERANDS, _norm_kind, _operand, _output, _rounded
from aotc.kernels.programmatic import after_predecessor, waits_programmatically

OP = "aotc::fused_rows_gemm_cuda"
BLOCK_R = 16  # rows a program takes: the tensor cores' smallest product is 16 rows
ROWS = 16  # the most rows a step gives the kernel; more (a prefill) take the unfused program


@triton.jit
def _rows_norm_stats(x_rows, r_ok, K: tl.constexpr, eps, NORM: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """(shift, inverse) [BLOCK_R, 1] of each row's norm, as fused_gemv._norm_stats takes them for
    one row: RMSNorm (0, 1 / sqrt(mean square + eps)), LayerNorm (NORM 2) (mean, 1 / sqrt(the
    variance about it + eps))."""
    k = tl.arange(0, BLOCK_K)[None, :]
    sums = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
    shift = tl.zeros((BLOCK_R, 1), tl.float32)
    if NORM == 2:
        for k0 in range(0, K, BLOCK_K):
            ok = r_ok & (k0 + k < K)
            sums += tl.load(x_rows + k0 + k, mask=ok, other=0.0).to(tl.float32)
        shift = tl.sum(sums, axis=1)[:, None] / K
        sums = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ok = r_ok & (k0 + k < K)
        xk = tl.load(x_rows + k0 + k, mask=ok, other=0.0).to(tl.float32)
        xk = tl.where(ok, xk - shift, 0.0)
        sums += xk * xk
    return shift, 1.0 / tl.sqrt(tl.sum(sums, axis=1)[:, None] / K + eps)


@triton.jit
def aotc_pdl_fused_rows_gemm(
    x_ptr, w_ptr, b_ptr, norm_ptr, nb_ptr, res_ptr, scale_ptr, out_ptr, rows, n_out, x_stride,
    eps, clamp,
    K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, GELU: tl.constexpr,
    BIAS: tl.constexpr, RESIDUAL: tl.constexpr, CLAMP: tl.constexpr, SCALED: tl.constexpr,
    OPERAND: tl.constexpr, SCALE_BLOCK: tl.constexpr, IEEE: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """BLOCK_R rows (program_id 1) times BLOCK_N output features (program_id 0); the module's doc.
    With SCALE_BLOCK (fp8's scales per block of input features) BLOCK_K is one such block, whose
    sums are scaled before they join the accumulator."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_out
    w_dtype = w_ptr.dtype.element_ty
    # the activations and the residual (a predecessor's) read after the wait; the weights need none
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R) + after_predecessor(PDL)
    r_ok = (r < rows)[:, None]
    x_rows = x_ptr + r[:, None] * x_stride
    shift = tl.zeros((BLOCK_R, 1), tl.float32)
    inverse = tl.full((BLOCK_R, 1), 1.0, tl.float32)
    if NORM:
        shift, inverse = _rows_norm_stats(x_rows, r_ok, K, eps, NORM, BLOCK_R, BLOCK_K)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_R, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + k
        kk_ok = kk < K
        w_ok = n_ok[:, None] & kk_ok[None, :]
        w = tl.load(w_ptr + n[:, None] * K + kk[None, :], mask=w_ok, other=0.0)
        a = _operand(
            x_rows, norm_ptr, nb_ptr, kk[None, :], r_ok & kk_ok[None, :], K, shift, inverse, clamp,
            NORM, GATED, GELU, CLAMP, w_dtype, OPERAND,
        )  # fmt: skip
        # the operand is already rounded to the product's dtype: exact in that dtype again
        if IEEE:
            part = tl.dot(a, tl.trans(w.to(tl.float32)), input_precision="ieee")
        elif OPERAND == 17 or (OPERAND == 0 and w_dtype == tl.float16):
            part = tl.dot(a.to(tl.float16), tl.trans(w.to(tl.float16)))
        else:
            part = tl.dot(a.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
        if SCALE_BLOCK:  # fp8: this block's sums times its scale
            block = k0 // SCALE_BLOCK
            s = tl.load(scale_ptr + n * (K // SCALE_BLOCK) + block, mask=n_ok, other=0.0)
            part = part * s.to(tl.float32)[None, :]
        acc += part
    if SCALED:  # the quantized product's output, then its bias added in that dtype
        if SCALE_BLOCK == 0:  # int8 rows: each output feature's scale on its sums
            acc = acc * tl.load(scale_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y = _rounded(acc, w_dtype, OPERAND)
        if BIAS:
            b = tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            y = _rounded(y.to(tl.float32) + b, w_dtype, OPERAND)
    else:  # the float product's output, its bias summed in
        y = acc
        if BIAS:
            y += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y = y.to(w_dtype)
    at = r[:, None] * n_out + n[None, :]
    ok = r_ok & n_ok[None, :]
    if RESIDUAL:
        out = tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32) + y.to(tl.float32)
    else:
        out = y
    tl.store(out_ptr + at, out, mask=ok)


def launch_shape(n_out: int, k_in: int, scale_block: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, warps, stages): 16 output features a program (a 2,048-wide product
    gives 128 programs, about one an SM of an H100 or H200), 128 input features a block (fp8: its
    scales' block), three blocks in flight. A first rule, to be swept on the GPU."""
    block_k = scale_block or min(128, max(16, triton.next_power_of_2(k_in)))
    return 16, block_k, 4, 3


def fused_rows_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    gated: bool,
    clamp: float,
    launch=lambda k: k,
    shape: tuple[int, int, int, int] | None = None,
    pdl: bool = False,
    scale: torch.Tensor | None = None,
    operand_dtype: torch.dtype | None = None,
    norm_bias: torch.Tensor | None = None,
    layer_norm: bool = False,
    gelu: bool = False,
    norm_rounded: bool = False,
) -> torch.Tensor:
    """fused_gemv.fused_gemv's product and arguments for any number of rows (the kernel is meant
    for 5 to ROWS), each weight tile read once for BLOCK_R rows. `shape`: (BLOCK_N, BLOCK_K,
    warps, stages) instead of launch_shape's. `pdl`: launched by Triton with programmatic
    dependent launch (a package's launcher decides that itself)."""
    rows = x.shape[0]
    n_out, k_in = weight.shape
    product_dtype = weight.dtype if scale is None else operand_dtype
    if product_dtype is None:
        raise ValueError("a quantized weight's product needs its operand dtype")
    out = _output(x, n_out, residual, product_dtype)
    scale_block = k_in // scale.shape[1] if scale is not None and scale.dim() == 2 else 0
    block_n, block_k, warps, stages = shape or launch_shape(n_out, k_in, scale_block)
    if layer_norm and norm_bias is None:  # a LayerNorm without a bias adds zeros
        norm_bias = torch.zeros_like(norm_weight)
    # an absent operand's pointer is the weight's: the kernel never reads it (its flag is off)
    launch(aotc_pdl_fused_rows_gemm)[(triton.cdiv(n_out, block_n), triton.cdiv(rows, BLOCK_R))](
        x, weight, weight if bias is None else bias, weight if norm_weight is None else norm_weight,
        weight if norm_bias is None else norm_bias, weight if residual is None else residual,
        weight if scale is None else scale, out, rows, n_out, x.stride(0), eps, clamp,
        K=k_in, NORM=_norm_kind(norm_weight, layer_norm, norm_rounded), GATED=gated, GELU=gelu,
        BIAS=bias is not None, RESIDUAL=residual is not None, CLAMP=clamp > 0,
        SCALED=scale is not None, OPERAND=0 if scale is None else OPERANDS[product_dtype],
        SCALE_BLOCK=scale_block, IEEE=product_dtype == torch.float32, BLOCK_R=BLOCK_R,
        BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl or waits_programmatically(x.device),
        num_warps=warps, num_stages=stages, **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return out


@triton_op(OP, mutates_args={})
def fused_rows_gemm_cuda(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    gated: bool,
    clamp: float,
    scale: torch.Tensor | None,
    operand_dtype: torch.dtype,
    norm_bias: torch.Tensor | None = None,
    layer_norm: bool = False,
    gelu: bool = False,
    norm_rounded: bool = False,
) -> torch.Tensor:
    """The fused product (fused_rows_gemm) of 5 to ROWS rows, compiled into the package."""
    return fused_rows_gemm(
        x, weight, bias, norm_weight, residual, eps, gated, clamp, launch=wrap_triton,
        scale=scale, operand_dtype=operand_dtype, norm_bias=norm_bias, layer_norm=layer_norm,
        gelu=gelu, norm_rounded=norm_rounded,
    )  # fmt: skip
