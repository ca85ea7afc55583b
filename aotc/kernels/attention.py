"""aotc::cached_attention on CUDA: a Triton kernel that reads only the cache positions each query
attends to, compiled into the package (AOTInductor compiles user Triton kernels registered through
`torch.library.triton_op`), so the Python runtime, the C++ runner and bundles need nothing new.

Split-K over the context (flash-decoding's idea, Dao et al. 2023): the programs of one (packed
token, query head) split the positions of its row up to its own into `splits` spans; each walks its
span in blocks of BLOCK_N with an online softmax (flash attention's) and writes its running
maximum, sum and weighted values. The last of a token and head's spans to finish combines them into
the output: each span counts itself on an int32 counter of its token and head after its partial
results (an atomic add that releases them, as a serial split-K GEMM's tiles count on a semaphore),
and the one that sees the others done reads theirs and writes the output. Only the spans the
token's context fills take part (spans are whole blocks of keys, so 176 positions fill three
blocks of 64 whatever the split count): a span past them stores and counts nothing, and the
last of those in use combines them. The counters are a buffer
the op zeroes (Inductor folds the fill into a neighbouring kernel of the package: no launch of its
own). On an H200 this took the 1B's decode step from 1.117 to 0.962 ms against a second combining
kernel (docs/benchmarks.md), which `fold=False` still launches. A decode step at batch 1 has only a
program per head, which leaves most of the GPU idle while each walks the whole context; split, one
layer's attention fills it. The split count depends only on the cache's batch and the head count
(static in a package), never on the tokens fed, so a CUDA graph replays the step. The spans'
partial results are a transient buffer of tokens x heads x splits x (dim + 2) floats: 38 KB a token
on SmolLM2's shape at batch 1, so a prefill of 1,024 tokens holds about 39 MB while it runs. A
token that is no row's (a free row's, at position L or past it) reads nothing and writes 0. The
loop ends where the token's context ends, so a step with 64 tokens in context reads 64 positions
whatever the cache's length, and a joining prompt's tokens cost their own row's reads only. Grouped
query heads read their key/value head's rows, which the GPU's cache holds for the group. The launch
rule and the same algorithm in plain PyTorch (the CPU reference CI tests) are in
split_attention.py.

A joining prompt's chunk is many tokens of one row, and there a program per token reads the row's
keys once per token: on an H200 a 256-token chunk beside 31 decode tokens (GPT-2, 32 rows) spent
0.5 ms of a 1.17 ms step in attention. So another kernel tiles them, FlashAttention-2's way (Dao
2023): one program per block of BLOCK_M packed tokens and query head multiplies the block's
queries by each BLOCK_N keys of the row on the tensor cores, with the online softmax, and writes
the output itself. The step's tokens are cut into blocks of BLOCK_M from the first; a block is
tiled when it is whole and its first and last tokens are one row's own (position below the
cache's length), which, a row's tokens being consecutive at consecutive positions, makes it
BLOCK_M consecutive queries of one row (`_in_tiled_block`, the one rule every kernel reads). The
per-token kernels skip a tiled block's tokens; the rest (decode tokens, a chunk's ragged edges, a
block across two rows, tokens that are no row's) take the per-token path as before. Every grid
depends on the token count alone and each program decides on the device, so a CUDA graph still
replays a step whatever it feeds. The tiled kernel's grid is the step's whole blocks, so a step of
fewer tokens than a block (a decode step of up to 63 rows) launches nothing more: Triton's and
AOTInductor's launchers skip an empty grid.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

# the launch-shape rule, and the algorithm without Triton that CI tests on the CPU
from aotc.kernels.programmatic import after_predecessor, waits_programmatically
from aotc.kernels.split_attention import BLOCK_M, BLOCK_N, split_count

OP = "aotc::cached_attention_cuda"
# the spans combined by the last of them to finish, not by a second kernel (the module's doc)
FOLD_COMBINE = True


@triton.jit
def _in_tiled_block(token, rows_ptr, positions_ptr, tokens, length, BLOCK_M: tl.constexpr):
    """Whether `token`'s block of BLOCK_M packed tokens is the tiled kernel's: whole, and its first
    and last tokens one row's own. BLOCK_M 0: no tiled kernel runs, no token is."""
    if BLOCK_M == 0:
        tiled = token < 0
    else:
        head = token // BLOCK_M * BLOCK_M
        tail = head + BLOCK_M - 1
        whole = tail < tokens
        tail = tl.minimum(tail, tokens - 1)  # a block cut short by the step's end reads its last
        one_row = tl.load(rows_ptr + head) == tl.load(rows_ptr + tail)
        own = (tl.load(positions_ptr + head) < length) & (tl.load(positions_ptr + tail) < length)
        tiled = whole & one_row & own
    return tiled


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b on the tensor cores; fp32 inputs as exact fp32 products (IEEE), not TF32, so an
    fp32 package stays within its build's eager check."""
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _combined(part, p_sp, untiled, used, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """One token and head's output from the partial results at `part` of its first `used` of
    SPLITS spans (the others hold nothing of this call): each span weighted by exp(its maximum -
    the largest), an empty span (maximum -inf, sum 0) by nothing, and 0 for a token that is no
    row's (every span empty). Read past the SM's own cache (.cg): other programs wrote the spans,
    and this SM may hold an older call's lines of the buffer."""
    spans = tl.arange(0, SPLITS)
    d = tl.arange(0, BLOCK_D)
    at = part + spans * p_sp
    read = untiled & (spans < used)
    m = tl.load(at + BLOCK_D, mask=read, other=float("-inf"), cache_modifier=".cg")
    sums = tl.load(at + BLOCK_D + 1, mask=read, other=0.0, cache_modifier=".cg")
    top = tl.max(m, axis=0)
    # an empty span (maximum -inf, sum 0) weighs nothing, also when every span is empty
    weight = tl.where(sums > 0, tl.exp(m - top), 0.0)
    total = tl.sum(sums * weight, axis=0)
    values = tl.load(at[:, None] + d[None, :], mask=read[:, None], other=0.0, cache_modifier=".cg")
    acc = tl.sum(values * weight[:, None], 0)
    return tl.where(total > 0, acc / total, 0.0)  # a token that is no row's sums 0


@triton.jit
def aotc_pdl_attention(
    q_ptr, k_ptr, v_ptr, rows_ptr, positions_ptr, part_ptr, out_ptr, count_ptr,
    q_sh, q_st, q_sd,
    k_sb, k_sn, k_sh, k_sd,
    v_sb, v_sn, v_sh, v_sd,
    p_sr, p_sp,
    o_st, o_sh, o_sd,
    tokens, heads, group, length, dim, scale, window, softcap,
    SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr, TILE_M: tl.constexpr, FOLD: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # everything read here may be a predecessor's output: every offset after the wait
    token_head = tl.program_id(0) + after_predecessor(PDL)
    split = tl.program_id(1)
    token = token_head // heads
    head = token_head % heads
    kv_head = head // group
    row = tl.load(rows_ptr + token)
    position = tl.load(positions_ptr + token)
    own = position < length  # a token at L or past it is no row's: an empty loop
    row = tl.where(own, row, 0)
    last = tl.where(own, position, 0)
    first = last * 0  # the loop's bounds of one type whatever the build makes constant
    if HAS_WINDOW:
        first = tl.maximum(last - window + 1, 0)
    # a token of a tiled block is the tiled kernel's: an empty loop here, and nothing stored
    tiled = _in_tiled_block(token, rows_ptr, positions_ptr, tokens, length, TILE_M)
    stop = tl.where(own & ~tiled, last + 1, first)
    # this program's span of [first, stop): whole blocks, the last span shorter
    chunk = tl.cdiv(tl.cdiv(stop - first, SPLITS), BLOCK_N) * BLOCK_N
    lo = first + split * chunk
    hi = tl.minimum(lo + chunk, stop)
    # the spans the context fills (at least one, which writes a token that is no row's): folded,
    # a span past them stores and counts nothing, so a short context costs the few spans it uses
    # (three of 16 at 176 positions in blocks of 64), not an atomic and a store for each of them
    used = tl.maximum(tl.cdiv(stop - first, tl.maximum(chunk, 1)), 1)
    if FOLD:
        active = split < used
    else:  # the combine kernel reads every span
        active = split >= 0
        used = used * 0 + SPLITS
    d = tl.arange(0, BLOCK_D)
    d_ok = d < dim
    q = tl.load(q_ptr + head * q_sh + token * q_st + d * q_sd, mask=d_ok, other=0.0)
    # back to fp32 after each product with a float argument: a build may pass those as fp64
    q = (q.to(tl.float32) * scale).to(tl.float32)
    m = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    k_row = k_ptr + row.to(tl.int64) * k_sb + kv_head * k_sh
    v_row = v_ptr + row.to(tl.int64) * v_sb + kv_head * v_sh
    for block in range(lo, hi, BLOCK_N):
        n = block + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        both = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_row + n[:, None] * k_sn + d[None, :] * k_sd, mask=both, other=0.0)
        # the values' block loaded with the keys', before the scores need the keys: both reads in
        # flight at once (a decode step's attention is a few dependent reads: 6-38% faster on an
        # H200, docs/benchmarks.md)
        v = tl.load(v_row + n[:, None] * v_sn + d[None, :] * v_sd, mask=both, other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
        if SOFTCAP:
            # tanh(x) = 2 sigmoid(2x) - 1
            s = (softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)).to(tl.float32)
        s = tl.where(n_ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m = m_new
    if SPLITS == 1:  # the whole context: the output itself
        out = tl.where(total > 0, acc / total, 0.0)  # a token that is no row's sums 0
        o = out_ptr + token * o_st + head * o_sh + d * o_sd
        tl.store(o, out.to(out_ptr.dtype.element_ty), mask=d_ok & ~tiled)
    else:  # the span's BLOCK_D weighted values, then its maximum and its sum (0 if empty)
        part = part_ptr + token_head * p_sr + split * p_sp
        tl.store(part + d, acc, mask=~tiled & active)
        tl.store(part + BLOCK_D, m, mask=~tiled & active)
        tl.store(part + BLOCK_D + 1, total, mask=~tiled & active)
        if FOLD:
            # the last of the token and head's spans in use to finish combines them (split-K's
            # semaphore, as CUTLASS's serial split-K reduction counts its tiles): every thread's
            # stores before the count (the barrier), the count a release of them and an acquire
            # of the other spans'; the counter is left at 0 for the next call
            tl.debug_barrier()
            done = tl.atomic_add(count_ptr + token_head, 1, mask=active, sem="acq_rel", scope="gpu")
            if active & (done == used - 1):
                out = _combined(part_ptr + token_head * p_sr, p_sp, ~tiled, used, SPLITS, BLOCK_D)
                o = out_ptr + token * o_st + head * o_sh + d * o_sd
                tl.store(o, out.to(out_ptr.dtype.element_ty), mask=d_ok & ~tiled)
                tl.store(count_ptr + token_head, 0)


@triton.jit
def aotc_pdl_combine(
    part_ptr, out_ptr, rows_ptr, positions_ptr,
    p_sr, p_sp,
    o_st, o_sh, o_sd,
    tokens, heads, length, dim,
    SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, TILE_M: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    token_head = tl.program_id(0) + after_predecessor(PDL)  # the spans read after the wait
    token = token_head // heads
    head = token_head % heads
    # a tiled block's token has no spans (the tiled kernel wrote its output): read and write nothing
    untiled = ~_in_tiled_block(token, rows_ptr, positions_ptr, tokens, length, TILE_M)
    out = _combined(part_ptr + token_head * p_sr, p_sp, untiled, SPLITS, SPLITS, BLOCK_D)
    d = tl.arange(0, BLOCK_D)
    o = out_ptr + token * o_st + head * o_sh + d * o_sd
    tl.store(o, out.to(out_ptr.dtype.element_ty), mask=(d < dim) & untiled)


@triton.jit
def aotc_pdl_tiled_attention(
    q_ptr, k_ptr, v_ptr, rows_ptr, positions_ptr, out_ptr,
    q_sh, q_st, q_sd,
    k_sb, k_sn, k_sh, k_sd,
    v_sb, v_sn, v_sh, v_sd,
    o_st, o_sh, o_sd,
    tokens, group, length, dim, scale, window, softcap,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    start = tl.program_id(0) * BLOCK_M + after_predecessor(PDL)  # every read after the wait
    head = tl.program_id(1)
    kv_head = head // group
    tiled = _in_tiled_block(start, rows_ptr, positions_ptr, tokens, length, BLOCK_M)
    t = start + tl.arange(0, BLOCK_M)
    t_ok = (t < tokens) & tiled  # a block that is not tiled loads and stores nothing
    # each query's own position and the first it attends to; clamped into the cache, so a step
    # no generation makes (positions not consecutive) reads nothing outside it
    last = tl.load(positions_ptr + t, mask=t_ok, other=0)
    last = tl.minimum(tl.maximum(last, 0), length - 1)
    first = last * 0
    if HAS_WINDOW:
        first = tl.maximum(last - window + 1, 0)
    # the keys of the block: from the first query's window to the last query (an empty loop for
    # a block that is not tiled, whose tokens the per-token kernels serve)
    lo = tl.min(first, axis=0)
    hi = tl.where(tiled, tl.max(last, axis=0) + 1, lo)
    row = tl.where(tiled, tl.load(rows_ptr + start), 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < dim
    q_tile = t_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + head * q_sh + t[:, None] * q_st + d[None, :] * q_sd, mask=q_tile, other=0.0)
    # in the cache's dtype, as the reference multiplies (a bf16 build's query can be fp32)
    q = q.to(k_ptr.dtype.element_ty)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    k_row = k_ptr + row.to(tl.int64) * k_sb + kv_head * k_sh
    v_row = v_ptr + row.to(tl.int64) * v_sb + kv_head * v_sh
    for block in range(lo, hi, BLOCK_N):
        n = block + tl.arange(0, BLOCK_N)
        both = (n < hi)[:, None] & d_ok[None, :]
        k = tl.load(k_row + n[:, None] * k_sn + d[None, :] * k_sd, mask=both, other=0.0)
        s = _dot(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), IEEE)
        # back to fp32 after each product with a float argument: a build may pass those as fp64
        s = (s * scale).to(tl.float32)
        if SOFTCAP:  # tanh(x) = 2 sigmoid(2x) - 1, as the per-token kernel
            s = (softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)).to(tl.float32)
        # causal by position, and each query's own window
        seen = (n[None, :] <= last[:, None]) & (n[None, :] >= first[:, None])
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        # a query whose window starts past this block has seen nothing yet: its sums stay 0
        # (exp(-inf - -inf) would be NaN)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        v = tl.load(v_row + n[:, None] * v_sn + d[None, :] * v_sd, mask=both, other=0.0)
        total = total * alpha + tl.sum(p, axis=1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
        m = m_new
    # every query of a tiled block attends to its own position at least: total > 0
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    o = out_ptr + t[:, None] * o_st + head * o_sh + d[None, :] * o_sd
    tl.store(o, out.to(out_ptr.dtype.element_ty), mask=q_tile)


def _tile_shape(block_d: int, itemsize: int) -> tuple[int, int]:
    """(BLOCK_N, warps) of the tiled kernel: BLOCK_N keys of at most 256 bytes a row (fewer keys
    for wide heads and fp32, so a stage of keys and values stays within shared memory), and a
    second warpgroup for the [BLOCK_M, 256] accumulator of the widest heads."""
    row_bytes = block_d * itemsize
    block_n = 64 if row_bytes <= 256 else 32 if row_bytes <= 512 else 16
    return block_n, 4 if block_d <= 128 else 8


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
    splits: int,
    launch=lambda kernel: kernel,  # wrap_triton inside the op; the kernel itself elsewhere
    block_m: int = BLOCK_M,
    block_n: int | None = None,
    warps: int | None = None,
    fold: bool = False,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention of the packed tokens `query` [1, heads, T, dim] over the cache, each token's
    context split `splits` ways (a power of two) in blocks of `block_n` keys by `warps` warps (by
    default the tiled kernel's, or 64 keys and 4 warps without it), the
    tiled blocks of `block_m` tokens (a power of two, at least 16; 0: none, every token per token)
    by the tiled kernel; [1, T, heads, dim]. `fold`: the last span of each token and head to finish
    combines the spans (no second kernel), counting on `counts` (T x heads int32 zeros, left
    zero; a new buffer if None)."""
    _one, heads, tokens, dim = query.shape
    kv_heads = keys.shape[2]
    length = keys.shape[1] - 1  # slot `length` is the padding's: never read
    out = torch.empty((1, tokens, heads, dim), dtype=query.dtype, device=query.device)
    block_d = max(16, triton.next_power_of_2(dim))
    pdl = waits_programmatically(query.device)
    tile_n, tile_warps = _tile_shape(block_d, keys.element_size()) if block_m else (BLOCK_N, 4)
    block_n = block_n or tile_n
    warps = warps or tile_warps
    if block_m:
        # whole blocks only (a tiled block is whole): a step of fewer tokens than a block (a
        # decode step) has an empty grid, which Triton's and AOTInductor's launchers skip
        launch(aotc_pdl_tiled_attention)[(tokens // block_m, heads)](
            query, keys, values, rows, positions, out,
            query.stride(1), query.stride(2), query.stride(3),
            keys.stride(0), keys.stride(1), keys.stride(2), keys.stride(3),
            values.stride(0), values.stride(1), values.stride(2), values.stride(3),
            out.stride(1), out.stride(2), out.stride(3),
            tokens, heads // kv_heads, length, dim, scale, window, softcap,
            BLOCK_M=block_m, BLOCK_N=tile_n, BLOCK_D=block_d, SOFTCAP=softcap > 0,
            HAS_WINDOW=window > 0, IEEE=keys.dtype == torch.float32, PDL=pdl,
            num_warps=tile_warps, num_stages=2,
        )  # fmt: skip
    # one span writes the output itself: no partial results, no second kernel
    spans = (tokens * heads, splits, block_d + 2) if splits > 1 else (1, 1, 1)
    part = torch.empty(spans, dtype=torch.float32, device=query.device)
    fold = fold and splits > 1
    if not fold:  # the counters are never read: no buffer to make and fill for each call
        counts = part
    elif counts is None:
        counts = torch.zeros(tokens * heads, dtype=torch.int32, device=query.device)
    launch(aotc_pdl_attention)[(tokens * heads, splits)](
        query, keys, values, rows, positions, part, out, counts,
        query.stride(1), query.stride(2), query.stride(3),
        keys.stride(0), keys.stride(1), keys.stride(2), keys.stride(3),
        values.stride(0), values.stride(1), values.stride(2), values.stride(3),
        part.stride(0), part.stride(1),
        out.stride(1), out.stride(2), out.stride(3),
        tokens, heads, heads // kv_heads, length, dim, scale, window, softcap,
        SPLITS=splits, BLOCK_N=block_n, BLOCK_D=block_d, SOFTCAP=softcap > 0,
        HAS_WINDOW=window > 0, TILE_M=block_m, FOLD=fold, PDL=pdl, num_warps=warps,
    )  # fmt: skip
    if splits == 1 or fold:
        return out
    launch(aotc_pdl_combine)[(tokens * heads,)](
        part, out, rows, positions,
        part.stride(0), part.stride(1),
        out.stride(1), out.stride(2), out.stride(3),
        tokens, heads, length, dim,
        SPLITS=splits, BLOCK_D=block_d, TILE_M=block_m, PDL=pdl,
    )  # fmt: skip
    return out


@triton_op(OP, mutates_args={})
def cached_attention_cuda(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
) -> torch.Tensor:
    # split by the cache's batch (static in a package): a decode step feeds each row one token
    splits = split_count(keys.shape[0], query.shape[1])
    return attend(
        query, keys, values, rows, positions, scale, window, softcap, splits, launch=wrap_triton,
        fold=FOLD_COMBINE,
    )  # fmt: skip
