"""aotc::cached_attention on CUDA: a Triton kernel that reads only the cache positions each query
attends to, compiled into the package (AOTInductor compiles user Triton kernels registered through
`torch.library.triton_op`), so the Python runtime, the C++ runner and bundles need nothing new.

Split-K over the context (flash-decoding's idea, Dao et al. 2023): the programs of one (row, query
head, window token) split the positions its window admits, up to its own, into `splits` spans; each
walks its span in blocks of BLOCK_N with an online softmax (flash attention's) and writes its running
maximum, sum and weighted values; a second kernel combines the spans into the output. A decode step
at batch 1 has only a program per head, which leaves most of the GPU idle while each walks the whole
context; split, one layer's attention fills it. The split count depends only on the batch and the
head count (static in a package), never on the window, so a CUDA graph replays both kernels. The
spans' partial results are a transient buffer of B x heads x steps x splits x (dim + 2) floats: 38 KB
a token on SmolLM2's shape at batch 1, so a prefill of 1,024 tokens holds about 39 MB while it runs.
A padding token (before its row's first fed token) reads nothing and writes 0. The loop ends where
the row's context ends, so a step with 64 tokens in context reads 64 positions whatever the cache's
length. Grouped query heads read their key/value head's rows, which the GPU's cache holds for the
group. The launch rule and the same algorithm in plain PyTorch (the CPU reference CI tests) are in
split_attention.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

# the launch-shape rule, and the algorithm without Triton that CI tests on the CPU
from aotc.kernels.split_attention import BLOCK_N, split_count, traced_size

OP = "aotc::cached_attention_cuda"


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, starts_ptr, firsts_ptr, part_ptr, out_ptr,
    q_sb, q_sh, q_ss, q_sd,
    k_sb, k_sn, k_sh, k_sd,
    v_sb, v_sn, v_sh, v_sd,
    p_sr, p_ss, p_sp,
    o_sb, o_ss, o_sh, o_sd,
    heads, group, length, dim, scale, window, softcap,
    SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_FIRSTS: tl.constexpr,
):  # fmt: skip
    row_head = tl.program_id(0)
    token = tl.program_id(1)
    split = tl.program_id(2)
    row = row_head // heads
    head = row_head % heads
    kv_head = head // group
    start = tl.load(starts_ptr + row)
    last = tl.minimum(tl.maximum(start + token, 0), length - 1)  # the query's own position
    first = last * 0  # the loop's bounds of one type whatever the build makes constant
    if HAS_WINDOW:
        first = tl.maximum(last - window + 1, 0)
    stop = last + 1
    if HAS_FIRSTS:  # padding: an empty loop
        stop = tl.where(token < tl.load(firsts_ptr + row), first, stop)
    # this program's span of [first, stop): whole blocks, the last span shorter
    chunk = tl.cdiv(tl.cdiv(stop - first, SPLITS), BLOCK_N) * BLOCK_N
    lo = first + split * chunk
    hi = tl.minimum(lo + chunk, stop)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < dim
    q = tl.load(q_ptr + row * q_sb + head * q_sh + token * q_ss + d * q_sd, mask=d_ok, other=0.0)
    # back to fp32 after each product with a float argument: a build may pass those as fp64
    q = (q.to(tl.float32) * scale).to(tl.float32)
    m = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    k_row = k_ptr + row * k_sb + kv_head * k_sh
    v_row = v_ptr + row * v_sb + kv_head * v_sh
    for block in range(lo, hi, BLOCK_N):
        n = block + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        both = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_row + n[:, None] * k_sn + d[None, :] * k_sd, mask=both, other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
        if SOFTCAP:
            # tanh(x) = 2 sigmoid(2x) - 1
            s = (softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)).to(tl.float32)
        s = tl.where(n_ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_row + n[:, None] * v_sn + d[None, :] * v_sd, mask=both, other=0.0)
        total = total * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m = m_new
    if SPLITS == 1:  # the whole context: the output itself
        out = tl.where(total > 0, acc / total, 0.0)  # a padding token's sum is 0
        o = out_ptr + row * o_sb + token * o_ss + head * o_sh + d * o_sd
        tl.store(o, out.to(out_ptr.dtype.element_ty), mask=d_ok)
    else:  # the span's BLOCK_D weighted values, then its maximum and its sum (0 if empty)
        part = part_ptr + row_head * p_sr + token * p_ss + split * p_sp
        tl.store(part + d, acc)
        tl.store(part + BLOCK_D, m)
        tl.store(part + BLOCK_D + 1, total)


@triton.jit
def _combine_kernel(
    part_ptr, out_ptr,
    p_sr, p_ss, p_sp,
    o_sb, o_ss, o_sh, o_sd,
    heads, dim,
    SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    row_head = tl.program_id(0)
    token = tl.program_id(1)
    row = row_head // heads
    head = row_head % heads
    spans = tl.arange(0, SPLITS)
    d = tl.arange(0, BLOCK_D)
    part = part_ptr + row_head * p_sr + token * p_ss + spans * p_sp
    m = tl.load(part + BLOCK_D)
    sums = tl.load(part + BLOCK_D + 1)
    top = tl.max(m, axis=0)
    # an empty span (maximum -inf, sum 0) weighs nothing, also when every span is empty
    weight = tl.where(sums > 0, tl.exp(m - top), 0.0)
    total = tl.sum(sums * weight, axis=0)
    acc = tl.sum(tl.load(part[:, None] + d[None, :]) * weight[:, None], axis=0)
    out = tl.where(total > 0, acc / total, 0.0)  # a padding token's sum is 0
    o = out_ptr + row * o_sb + token * o_ss + head * o_sh + d * o_sd
    tl.store(o, out.to(out_ptr.dtype.element_ty), mask=d < dim)


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
    firsts: torch.Tensor | None,
    splits: int,
    launch=lambda kernel: kernel,  # wrap_triton inside the op; the kernel itself elsewhere
) -> torch.Tensor:
    """The attention of `query` [B, heads, steps, dim] over the cache, its context split `splits`
    ways (a power of two)."""
    batch, heads, steps, dim = query.shape
    kv_heads = keys.shape[2]
    length = keys.shape[1] - 1  # slot `length` is the padding's: never read
    out = torch.empty((batch, steps, heads, dim), dtype=query.dtype, device=query.device)
    block_d = max(16, triton.next_power_of_2(dim))
    # one span writes the output itself: no partial results, no second kernel
    spans = (batch * heads, steps, splits, block_d + 2) if splits > 1 else (1, 1, 1, 1)
    part = torch.empty(spans, dtype=torch.float32, device=query.device)
    launch(_attention_kernel)[(batch * heads, steps, splits)](
        query, keys, values, starts, starts if firsts is None else firsts, part, out,
        query.stride(0), query.stride(1), query.stride(2), query.stride(3),
        keys.stride(0), keys.stride(1), keys.stride(2), keys.stride(3),
        values.stride(0), values.stride(1), values.stride(2), values.stride(3),
        part.stride(0), part.stride(1), part.stride(2),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        heads, heads // kv_heads, length, dim, scale, window, softcap,
        SPLITS=splits, BLOCK_N=BLOCK_N, BLOCK_D=block_d, SOFTCAP=softcap > 0,
        HAS_WINDOW=window > 0, HAS_FIRSTS=firsts is not None,
    )  # fmt: skip
    if splits == 1:
        return out
    launch(_combine_kernel)[(batch * heads, steps)](
        part, out,
        part.stride(0), part.stride(1), part.stride(2),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        heads, dim,
        SPLITS=splits, BLOCK_D=block_d,
    )  # fmt: skip
    return out


@triton_op(OP, mutates_args={})
def cached_attention_cuda(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
    firsts: torch.Tensor | None = None,
) -> torch.Tensor:
    batch, heads = query.shape[0], query.shape[1]
    splits = split_count(traced_size(batch), heads)
    return attend(
        query, keys, values, starts, scale, window, softcap, firsts, splits, launch=wrap_triton
    )
