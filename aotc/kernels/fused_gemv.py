"""aotc::fused_gemv_cuda: a decode step's weight product with what surrounds it in a layer, one
launch instead of three.

At batch 1 a product of a small language model reads a megabyte or two, which takes the memory
well under a microsecond; what it costs is its launch, and the launches of the RMSNorm before it
and the residual add after it (SmolLM2-135M's step on an H200: 366 kernels, 12 a layer, none of
them long; docs/benchmarks.md). This kernel does the three in one:

- prologue, on the activations as they are loaded: the RMSNorm of each row (its mean square taken
  in a first pass over the row, which every program reads anyway) times the norm's weight (in a
  model exported in bf16 or fp16 the scaled row is first rounded to the model's dtype, as
  transformers' RMSNorm casts it back before the weight multiplies it), or a
  LayerNorm (its mean, then the variance about it, two passes) with its weight and bias; or the
  gated MLP's silu(gate) * up from the stacked gate/up product's output, or gelu_new (GPT-2's),
  each step rounded as the unfused ops round; then the clamp and cast to the weight's dtype that
  a reduced-precision build puts before the product;
- the product: a program takes one row and BLOCK_N output features, loads the row's input features
  and the weight tile at once (up to 2,048 features; a longer row loops), multiplies them in fp32
  and sums each output feature's products;
- epilogue: the bias, the rounding to the weight's dtype that the unfused product's output has,
  and the residual added in the residual's precision.

An int8-weight-only product (int8 rows, a scale per output feature) runs the same way: the int8
tile converted as it is loaded, each output feature's sum scaled in the epilogue.

Each step rounds where the unfused program rounds (aotc/export/fused_products.py's `reference`
is that program), so a fused package computes what the unfused one does, up to the order of the
sums. No split of the input features: the epilogue needs a row's whole sum, so small matrices take
narrow tiles instead, enough programs to cover the GPU.

The first form multiplied a 64 x 128 weight tile with 16 rows on the tensor cores, looping over
the input features in three pipelined stages (gemv.py's quantized layout): on an H200 it took 11.9
us a product in SmolLM2-135M's step where cuBLAS takes 3.9, and the step 3.77 ms against 1.01
(docs/benchmarks.md). At one row the loop's trips to memory one after another, and the shared
memory of its stages, cost more than the fusion saved.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from aotc.kernels.gemv import streaming_multiprocessors
from aotc.kernels.product_tiles import surroundings, tile_in_force
from aotc.kernels.programmatic import after_predecessor, waits_programmatically

OP = "aotc::fused_gemv_cuda"
OP_INT4 = "aotc::fused_int4_gemv_cuda"


# the product's operand dtype (OPERAND): the weight's (a float weight), or the one named here (an
# int8 weight, whose product takes the activations as the graph casts them)
OPERANDS = {torch.bfloat16: 16, torch.float16: 17, torch.float32: 32}


@triton.jit
def _rounded(v, w_dtype, OPERAND: tl.constexpr):
    """`v` rounded to the product's operand dtype."""
    if OPERAND == 16:
        r = v.to(tl.bfloat16)
    elif OPERAND == 17:
        r = v.to(tl.float16)
    elif OPERAND == 32:
        r = v.to(tl.float32)
    else:
        r = v.to(w_dtype)
    return r


@triton.jit
def _gelu_tanh(h, x_dtype):
    """transformers' gelu_new (GPT-2's, phi's), 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))),
    of fp32 values `h`, each of its seven steps rounded to the activations' dtype as the unfused
    program's ops round; tanh(x) = 2 sigmoid(2x) - 1."""
    half = (h * 0.5).to(x_dtype).to(tl.float32)
    cube = (h * h * h).to(x_dtype).to(tl.float32)
    inner = (cube * 0.044715).to(x_dtype).to(tl.float32)
    inner = (h + inner).to(x_dtype).to(tl.float32)
    inner = (inner * 0.7978845608028654).to(x_dtype).to(tl.float32)
    tanh = (2.0 * tl.sigmoid(2.0 * inner) - 1.0).to(x_dtype).to(tl.float32)
    return (half * (tanh + 1.0).to(x_dtype).to(tl.float32)).to(x_dtype)


@triton.jit
def _norm_stats(x_row, K: tl.constexpr, eps, NORM: tl.constexpr, BLOCK_K: tl.constexpr):
    """(shift, inverse) of the row's norm, in fp32 as the unfused norm takes them: RMSNorm (NORM
    1) (0, 1 / sqrt(mean square + eps)), LayerNorm (NORM 2) (mean, 1 / sqrt(variance + eps)),
    the variance over the deviations from the mean (a second pass, not E[x^2] - mean^2)."""
    k = tl.arange(0, BLOCK_K)
    shift = 0.0
    sums = tl.zeros((BLOCK_K,), tl.float32)
    if NORM == 2:
        for k0 in range(0, K, BLOCK_K):
            sums += tl.load(x_row + k0 + k, mask=k0 + k < K, other=0.0).to(tl.float32)
        shift = tl.sum(sums, axis=0) / K
        sums = tl.zeros((BLOCK_K,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ok = k0 + k < K
        xk = tl.load(x_row + k0 + k, mask=ok, other=0.0).to(tl.float32)
        xk = tl.where(ok, xk - shift, 0.0)
        sums += xk * xk
    return shift, 1.0 / tl.sqrt(tl.sum(sums, axis=0) / K + eps)


@triton.jit
def _operand(x_row, norm_ptr, nb_ptr, k, k_ok, K, shift, inverse, clamp, NORM: tl.constexpr,
             GATED: tl.constexpr, GELU: tl.constexpr, CLAMP: tl.constexpr, w_dtype,
             OPERAND: tl.constexpr):  # fmt: skip
    """The product's operand at input features `k`: the row's activations through the prologue
    (silu(gate) * up or gelu_new, the norm, the clamp), in the operand dtype, as fp32."""
    x_dtype = x_row.dtype.element_ty
    a = tl.load(x_row + k, mask=k_ok, other=0.0)
    if GATED:  # silu(gate) * up, each rounded to the activations' dtype as the graph does
        gate = a.to(tl.float32)
        up = tl.load(x_row + K + k, mask=k_ok, other=0.0).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(x_dtype)
        a = (silu.to(tl.float32) * up).to(x_dtype)
    if GELU:
        a = _gelu_tanh(a.to(tl.float32), x_dtype)
    a = a.to(tl.float32)
    if NORM == 1:  # RMSNorm: its weight times the row scaled
        a = tl.load(norm_ptr + k, mask=k_ok, other=0.0).to(tl.float32) * (a * inverse)
    elif NORM == 3:  # RMSNorm of a model in half precision: the scaled row rounded to the
        # weight's dtype before the weight multiplies it, as transformers' RMSNorm casts it back
        scaled = (a * inverse).to(norm_ptr.dtype.element_ty).to(tl.float32)
        a = tl.load(norm_ptr + k, mask=k_ok, other=0.0).to(tl.float32) * scaled
    elif NORM == 2:  # LayerNorm, in the activations' dtype as aten.layer_norm returns it
        w = tl.load(norm_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        b = tl.load(nb_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        a = ((a - shift) * inverse * w + b).to(x_dtype).to(tl.float32)
    if CLAMP:
        a = tl.minimum(tl.maximum(a, -clamp), clamp)
    # the product's operand in its dtype, as the unfused product takes it
    return _rounded(a, w_dtype, OPERAND).to(tl.float32)


@triton.jit
def _tile_sums(w, a, scale_ptr, n, n_ok, k0, K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """Each output feature's sum over the tile's input features k0 + [0, BLOCK_K) of the weight
    tile `w` times the operand `a`, in fp32. With SCALE_BLOCK (fp8's blocks; scales [N, K /
    SCALE_BLOCK]): each block's sum times its scale, one scale read per block rather than one per
    weight (a gather of four bytes for each byte of weight read cost fp8 its bandwidth)."""
    products = w.to(tl.float32) * a[None, :]
    if SCALE_BLOCK:
        tl.static_assert(BLOCK_K % SCALE_BLOCK == 0, "a tile holds whole blocks of fp8 scales")
        BLOCKS: tl.constexpr = BLOCK_K // SCALE_BLOCK
        sums = tl.sum(tl.reshape(products, (BLOCK_N, BLOCKS, SCALE_BLOCK)), axis=2)
        block = k0 // SCALE_BLOCK + tl.arange(0, BLOCKS)
        at = n[:, None] * (K // SCALE_BLOCK) + block[None, :]
        ok = n_ok[:, None] & (block < K // SCALE_BLOCK)[None, :]
        total = tl.sum(sums * tl.load(scale_ptr + at, mask=ok, other=0.0), axis=1)
    else:
        total = tl.sum(products, axis=1)
    return total


@triton.jit
def aotc_pdl_fused_gemv(
    x_ptr, w_ptr, b_ptr, norm_ptr, nb_ptr, res_ptr, scale_ptr, out_ptr, n_out, x_stride, eps, clamp,
    K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, GELU: tl.constexpr, BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr, CLAMP: tl.constexpr, SCALED: tl.constexpr, OPERAND: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One row (program_id 1) times BLOCK_N output features (program_id 0). With K <= BLOCK_K the
    row and the weight tile are one load each, all in flight at once: the kernel costs about one
    trip to memory, which is what a product of a megabyte or two can cost.

    The first weight tile is loaded before anything the previous kernel writes. With PDL (Hopper's
    programmatic dependent launch, the kernel launched with it) the kernel starts while its
    predecessor finishes, its weight read in flight, and waits (griddepcontrol.wait: the
    predecessor complete and its writes visible) only before it reads the activations; it lets
    its own successor start at once, which waits the same way.

    SCALED: an int8 weight with a scale per output feature (int8-weight-only): the sums of the
    int8 weights times the operand, times the row's scale, rounded to the operand's dtype, then
    the bias added, as the unfused int8 product and its bias add round. With SCALE_BLOCK, an fp8
    weight with a scale per output feature and block of SCALE_BLOCK input features (fp8): each
    weight times its block's scale inside the sum, then rounded and the bias added the same way."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_out
    w_dtype = w_ptr.dtype.element_ty
    k = tl.arange(0, BLOCK_K)
    k_ok = k < K
    w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    # the activations and the residual (a predecessor's) read after the wait
    row = tl.program_id(1) + after_predecessor(PDL)
    x_row = x_ptr + row * x_stride
    shift, inverse = 0.0, 1.0
    if NORM:
        shift, inverse = _norm_stats(x_row, K, eps, NORM, BLOCK_K)
    a = _operand(
        x_row, norm_ptr, nb_ptr, k, k_ok, K, shift, inverse, clamp, NORM, GATED, GELU, CLAMP,
        w_dtype, OPERAND,
    )  # fmt: skip
    # a longer row adds each tile's products into one accumulator of the tile's shape and sums it
    # once after the loop (a sum per tile is a reduction across threads every trip); fp8's block
    # scales are applied to each tile's block sums
    acc = _tile_sums(w, a, scale_ptr, n, n_ok, 0, K, SCALE_BLOCK, BLOCK_N, BLOCK_K)
    products = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        kk = k0 + k
        kk_ok = kk < K
        # a name of its own: Triton types a variable carried through a loop once
        stored = tl.load(
            w_ptr + n[:, None] * K + kk[None, :], mask=n_ok[:, None] & kk_ok[None, :], other=0.0
        )
        a = _operand(
            x_row, norm_ptr, nb_ptr, kk, kk_ok, K, shift, inverse, clamp, NORM, GATED, GELU, CLAMP,
            w_dtype, OPERAND,
        )  # fmt: skip
        if SCALE_BLOCK:
            acc += _tile_sums(stored, a, scale_ptr, n, n_ok, k0, K, SCALE_BLOCK, BLOCK_N, BLOCK_K)
        else:
            products += stored.to(tl.float32) * a[None, :]
    if not SCALE_BLOCK:
        acc += tl.sum(products, axis=1)
    if SCALED:  # the quantized product's output, then its bias added in that dtype
        if SCALE_BLOCK == 0:  # int8 rows: the row's scale on its sum
            acc = acc * tl.load(scale_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
        y = _rounded(acc, w_dtype, OPERAND)
        if BIAS:
            b = tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
            y = _rounded(y.to(tl.float32) + b, w_dtype, OPERAND)
    else:  # the float product's output, its bias summed in
        y = acc
        if BIAS:
            y += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
        y = y.to(w_dtype)
    if RESIDUAL:
        r = tl.load(res_ptr + row * n_out + n, mask=n_ok, other=0.0)
        out = r.to(tl.float32) + y.to(tl.float32)
    else:
        out = y
    tl.store(out_ptr + row * n_out + n, out, mask=n_ok)


@triton.jit
def _int4_tile(p_ptr, sz_ptr, n, n_ok, g, j, groups, K: tl.constexpr, H: tl.constexpr):
    """Groups `g` of output features `n` ([BLOCK_N, 1, 1] and [1, BLOCK_G, 1]): their packed
    bytes [BLOCK_N, BLOCK_G, H] and their scales and zeros [BLOCK_N, BLOCK_G, 1] (fp32); groups
    past the last read as 0. Three dimensions throughout: each is broadcast to the tile, never
    expanded from a layout of two (a conversion through shared memory every tile)."""
    both = n_ok & (g < groups)
    packed = tl.load(p_ptr + n * (K // 2) + g * H + j, mask=both, other=0)
    at = (n * groups + g) * 2
    scale = tl.load(sz_ptr + at, mask=both, other=0.0).to(tl.float32)
    zero = tl.load(sz_ptr + at + 1, mask=both, other=0.0).to(tl.float32)
    return packed, scale, zero


@triton.jit
def _level(nibble):
    """A level (0-15, int32) minus 8 in fp32 without a conversion instruction (the GPU converts an
    integer at a quarter of its add rate, and this kernel converts two a byte it reads): under the
    exponent of 2**23 (0x4B000000) the level makes the float 2**23 + level exactly; subtracting
    2**23 + 8 leaves level - 8. The bit trick of FasterTransformer's and Marlin's dequantization."""
    return (nibble | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0


@triton.jit
def aotc_pdl_fused_int4_gemv(
    x_ptr, p_ptr, sz_ptr, b_ptr, norm_ptr, res_ptr, out_ptr, n_out, x_stride, eps, clamp,
    K: tl.constexpr, GROUP: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
    BIAS: tl.constexpr, RESIDUAL: tl.constexpr, CLAMP: tl.constexpr, OPERAND: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The fused product over int4 groups as aotc stores them (quantized_linear.int4_groups: two
    levels a byte, a group's first half in the low nibbles and its second half in the high ones,
    w = (level - 8) * scale + zero per group). A program takes one row and BLOCK_N output
    features, BLOCK_G groups of input features at a time. Each weight is dequantized in fp32 as
    it is read (one multiply-add) and its product with the operand added into an accumulator of
    the tile's shape, summed once after the loop: no reduction across threads inside the loop.
    The next tile's bytes are loaded before the current one is multiplied, and the first before
    the wait for the predecessor (PDL). The output is rounded to the operand's dtype and the bias
    added after, as the unfused int4 product and its bias add round."""
    H: tl.constexpr = GROUP // 2
    groups = K // GROUP
    n1 = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n = n1[:, None, None]
    n_ok = n < n_out
    g = tl.arange(0, BLOCK_G)[None, :, None]
    j = tl.arange(0, H)[None, None, :]
    packed, scale, zero = _int4_tile(p_ptr, sz_ptr, n, n_ok, g, j, groups, K, H)
    row = tl.program_id(1) + after_predecessor(PDL)  # the activations read after the wait
    x_row = x_ptr + row * x_stride
    inverse_rms = 1.0
    if NORM:  # the row's mean square, in fp32 as the unfused norm takes it
        squares = tl.zeros((1, BLOCK_G, H), tl.float32)
        for g0 in range(0, groups, BLOCK_G):
            k = (g0 + g) * GROUP + j
            ok = g0 + g < groups
            lo = tl.load(x_row + k, mask=ok, other=0.0).to(tl.float32)
            hi = tl.load(x_row + k + H, mask=ok, other=0.0).to(tl.float32)
            squares += lo * lo + hi * hi
        inverse_rms = 1.0 / tl.sqrt(
            tl.sum(tl.sum(tl.sum(squares, axis=2), axis=1), axis=0) / K + eps
        )
    acc = tl.zeros((BLOCK_N, BLOCK_G, H), tl.float32)
    for g0 in range(0, groups, BLOCK_G):
        k_lo = (g0 + g) * GROUP + j  # [1, BLOCK_G, H]: the low nibbles' features
        ok = g0 + g < groups  # a group past the last reads 0
        a_lo = _operand(
            x_row, norm_ptr, norm_ptr, k_lo, ok, K, 0.0, inverse_rms, clamp, NORM, GATED, False,
            CLAMP, tl.float32, OPERAND,
        )  # fmt: skip
        a_hi = _operand(
            x_row, norm_ptr, norm_ptr, k_lo + H, ok, K, 0.0, inverse_rms, clamp, NORM, GATED,
            False, CLAMP, tl.float32, OPERAND,
        )  # fmt: skip
        this_packed, this_scale, this_zero = packed, scale, zero
        # the next tile's bytes in flight while this one is multiplied
        packed, scale, zero = _int4_tile(p_ptr, sz_ptr, n, n_ok, g0 + BLOCK_G + g, j, groups, K, H)
        bits = this_packed.to(tl.int32)
        low = _level(bits & 15) * this_scale + this_zero
        high = _level(bits >> 4) * this_scale + this_zero
        acc += low * a_lo + high * a_hi
    y = _rounded(tl.sum(tl.sum(acc, axis=2), axis=1), tl.float32, OPERAND)
    n = n1
    n_ok = n < n_out
    if BIAS:
        b = tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
        y = _rounded(y.to(tl.float32) + b, tl.float32, OPERAND)
    if RESIDUAL:
        r = tl.load(res_ptr + row * n_out + n, mask=n_ok, other=0.0)
        out = r.to(tl.float32) + y.to(tl.float32)
    else:
        out = y
    tl.store(out_ptr + row * n_out + n, out, mask=n_ok)


def launch_shape(n_out: int, k_in: int, programs_wanted: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps): input features in one block up to 2,048 (more loop over blocks
    of 2,048), and the widest tile of output features (16 down to 1) that still gives
    `programs_wanted` programs a row, at most 16K weight elements a program (64 fp32 registers a
    thread at 8 warps)."""
    block_k = min(2048, triton.next_power_of_2(k_in))
    widest = max(1, 16384 // block_k)
    block_n = next(
        (b for b in (16, 8, 4, 2) if b <= widest and triton.cdiv(n_out, b) >= programs_wanted),
        1,
    )
    warps = 8 if block_n * block_k >= 8192 else 4
    return block_n, block_k, warps


def _norm_kind(norm_weight, layer_norm: bool, norm_rounded: bool = False) -> int:
    """The kernels' NORM: 0 none, 1 RMSNorm, 2 LayerNorm, 3 RMSNorm whose scaled row is rounded
    to its weight's dtype before the weight multiplies it (a model exported in bf16 or fp16)."""
    if norm_weight is None:
        return 0
    return 2 if layer_norm else 3 if norm_rounded else 1


def _output(x, n_out: int, residual, product_dtype) -> torch.Tensor:
    """The fused product's output [rows, n_out]: in the product's dtype, promoted with the
    residual's when one is added."""
    dtype = (
        product_dtype if residual is None else torch.promote_types(residual.dtype, product_dtype)
    )
    return torch.empty((x.shape[0], n_out), dtype=dtype, device=x.device)


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
    shape: tuple[int, int, int] | None = None,
    pdl: bool = False,
    scale: torch.Tensor | None = None,
    operand_dtype: torch.dtype | None = None,
    norm_bias: torch.Tensor | None = None,
    layer_norm: bool = False,
    gelu: bool = False,
    norm_rounded: bool = False,
) -> torch.Tensor:
    """x [rows, K] (or [rows, 2K] gate then up when `gated`), weight [N, K]: the fused product
    [rows, N], in the residual's and the product's promoted dtype when there is a residual [rows,
    N], else in the product's: the weight's, or for a quantized weight with its `scale` (int8
    rows: [N]; fp8 blocks: [N, K / block]), `operand_dtype`, the dtype its activations are cast
    to. `clamp` 0: no clamp. `shape`: (BLOCK_N, BLOCK_K, warps) instead of launch_shape's
    (scripts/fused_gemv.py sweeps them).
    `pdl`: launched by Triton with programmatic dependent launch (scripts/pdl_chain.py; a
    package's launcher decides that itself). `layer_norm`: the norm is a LayerNorm of weight
    `norm_weight` and bias `norm_bias` (None: no bias), not an RMSNorm; `gelu`: gelu_new first;
    `norm_rounded`: the RMSNorm's scaled row is rounded to `norm_weight`'s dtype before the
    weight multiplies it."""
    rows = x.shape[0]
    n_out, k_in = weight.shape
    product_dtype = weight.dtype if scale is None else operand_dtype
    if product_dtype is None:
        raise ValueError("a quantized weight's product needs its operand dtype")
    out = _output(x, n_out, residual, product_dtype)
    taken_in = (norm_weight is not None, gated, residual is not None)
    # a tile the build chose on its GPU for this weight shape (product_tiles.py), else the rule's
    block_n, block_k, warps = (
        shape
        or tile_in_force(n_out, k_in, weight.dtype, surroundings(*taken_in))
        or launch_shape(n_out, k_in, streaming_multiprocessors(x.device.index or 0))
    )
    # an absent operand's pointer is the weight's: the kernel never reads it (its flag is off)
    if layer_norm and norm_bias is None:  # a LayerNorm without a bias adds zeros
        norm_bias = torch.zeros_like(norm_weight)
    launch(aotc_pdl_fused_gemv)[(triton.cdiv(n_out, block_n), rows)](
        x, weight, weight if bias is None else bias, weight if norm_weight is None else norm_weight,
        weight if norm_bias is None else norm_bias, weight if residual is None else residual,
        weight if scale is None else scale, out, n_out, x.stride(0), eps, clamp,
        K=k_in, NORM=_norm_kind(norm_weight, layer_norm, norm_rounded), GATED=gated, GELU=gelu,
        BIAS=bias is not None,
        RESIDUAL=residual is not None, CLAMP=clamp > 0, SCALED=scale is not None,
        SCALE_BLOCK=k_in // scale.shape[1] if scale is not None and scale.dim() == 2 else 0,
        OPERAND=0 if scale is None else OPERANDS[product_dtype], BLOCK_N=block_n, BLOCK_K=block_k,
        PDL=pdl or waits_programmatically(x.device), num_warps=warps, num_stages=1,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return out


def int4_launch_shape(
    n_out: int, k_in: int, group: int, programs_wanted: int
) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_G, warps) of the int4 kernel: at most 4,096 packed bytes (8,192 levels) a
    tile, the widest tile of output features (16 down to 1) that still gives `programs_wanted`
    programs a row, and as many of the row's groups as the tile then holds."""
    groups = k_in // group
    block_n = next((b for b in (16, 8, 4, 2) if triton.cdiv(n_out, b) >= programs_wanted), 1)
    block_g = max(1, min(triton.next_power_of_2(groups), 4096 // (block_n * group // 2)))
    warps = 8 if block_n * block_g * group >= 8192 else 4
    return block_n, block_g, warps


def fused_int4_gemv(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale_zero: torch.Tensor,
    group: int,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    gated: bool,
    clamp: float,
    operand_dtype: torch.dtype,
    launch=lambda k: k,
    shape: tuple[int, int, int] | None = None,
    pdl: bool = False,
    norm_rounded: bool = False,
) -> torch.Tensor:
    """fused_gemv over int4 groups (quantized_linear.int4_groups: packed [N, K/2] uint8,
    scale_zero [N, K/group, 2]): [rows, N] in the residual's and `operand_dtype`'s promoted dtype
    when there is a residual, else in `operand_dtype`. `norm_rounded` as for fused_gemv."""
    rows = x.shape[0]
    n_out, k_in = packed.shape[0], packed.shape[1] * 2
    out = _output(x, n_out, residual, operand_dtype)
    taken_in = (norm_weight is not None, gated, residual is not None)
    # a tile the build chose on its GPU for this weight shape (product_tiles.py), else the rule's
    block_n, block_g, warps = (
        shape
        or tile_in_force(n_out, k_in, f"int4g{group}", surroundings(*taken_in))
        or int4_launch_shape(n_out, k_in, group, streaming_multiprocessors(x.device.index or 0))
    )
    # an absent operand's pointer is the scales': the kernel never reads it (its flag is off)
    launch(aotc_pdl_fused_int4_gemv)[(triton.cdiv(n_out, block_n), rows)](
        x, packed, scale_zero, scale_zero if bias is None else bias,
        scale_zero if norm_weight is None else norm_weight,
        scale_zero if residual is None else residual, out, n_out, x.stride(0), eps, clamp,
        K=k_in, GROUP=group, NORM=_norm_kind(norm_weight, False, norm_rounded), GATED=gated,
        BIAS=bias is not None,
        RESIDUAL=residual is not None, CLAMP=clamp > 0, OPERAND=OPERANDS[operand_dtype],
        BLOCK_N=block_n, BLOCK_G=block_g, PDL=pdl or waits_programmatically(x.device),
        num_warps=warps, num_stages=1, **({"launch_pdl": True} if pdl else {}),
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
    scale: torch.Tensor | None,
    operand_dtype: torch.dtype,
    norm_bias: torch.Tensor | None = None,
    layer_norm: bool = False,
    gelu: bool = False,
    norm_rounded: bool = False,
) -> torch.Tensor:
    """The fused product (fused_gemv) of at most MAX_ROWS rows, compiled into the package."""
    return fused_gemv(
        x, weight, bias, norm_weight, residual, eps, gated, clamp, launch=wrap_triton,
        scale=scale, operand_dtype=operand_dtype, norm_bias=norm_bias, layer_norm=layer_norm,
        gelu=gelu, norm_rounded=norm_rounded,
    )  # fmt: skip


@triton_op(OP_INT4, mutates_args={})
def fused_int4_gemv_cuda(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale_zero: torch.Tensor,
    group: int,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    gated: bool,
    clamp: float,
    operand_dtype: torch.dtype,
    norm_rounded: bool = False,
) -> torch.Tensor:
    """The fused product over int4 groups (fused_int4_gemv) of at most MAX_ROWS rows."""
    return fused_int4_gemv(
        x, packed, scale_zero, group, bias, norm_weight, residual, eps, gated, clamp,
        operand_dtype, launch=wrap_triton, norm_rounded=norm_rounded,
    )  # fmt: skip
