"""aotc::cached_attention on CUDA: a Triton kernel that reads only the cache positions each query
attends to, compiled into the package (AOTInductor compiles user Triton kernels registered through
`torch.library.triton_op`), so the Python runtime, the C++ runner and bundles need nothing new.

One program per (row, query head, window token): it walks the row's keys from the first its window
admits to its own position in blocks of BLOCK_N, with an online softmax (flash attention's), and
writes its output. A padding token (before its row's first fed token) reads nothing and writes 0.
Its loop ends where the row's context ends, so a step with 64 tokens in context
reads 64 positions whatever the cache's length; the grid depends only on shapes, so a CUDA graph
replays it. Grouped query heads read their key/value head's rows, which the GPU's cache holds for
the group. (Split-K over the context, flash-decoding's, would add parallelism for long contexts at
batch 1; at the contexts measured here one pass per head was enough to stop reading the whole
cache, which is what this kernel is for.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

OP = "aotc::cached_attention_cuda"


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, starts_ptr, firsts_ptr, out_ptr,
    q_sb, q_sh, q_ss, q_sd,
    k_sb, k_sn, k_sh, k_sd,
    v_sb, v_sn, v_sh, v_sd,
    o_sb, o_ss, o_sh, o_sd,
    heads, group, length, dim, scale, window, softcap,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_FIRSTS: tl.constexpr,
):  # fmt: skip
    row_head = tl.program_id(0)
    token = tl.program_id(1)
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
    for block in range(first, stop, BLOCK_N):
        n = block + tl.arange(0, BLOCK_N)
        n_ok = n <= last
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
    out = tl.where(total > 0, acc / total, 0.0)  # a padding token's sum is 0
    o = out_ptr + row * o_sb + token * o_ss + head * o_sh + d * o_sd
    tl.store(o, out.to(out_ptr.dtype.element_ty), mask=d_ok)


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
    batch, heads, steps, dim = query.shape
    kv_heads = keys.shape[2]
    length = keys.shape[1] - 1  # slot `length` is the padding's: never read
    out = torch.empty((batch, steps, heads, dim), dtype=query.dtype, device=query.device)
    block_d = max(16, triton.next_power_of_2(dim))
    wrap_triton(_attention_kernel)[(batch * heads, steps)](
        query, keys, values, starts, starts if firsts is None else firsts, out,
        query.stride(0), query.stride(1), query.stride(2), query.stride(3),
        keys.stride(0), keys.stride(1), keys.stride(2), keys.stride(3),
        values.stride(0), values.stride(1), values.stride(2), values.stride(3),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        heads, heads // kv_heads, length, dim, scale, window, softcap,
        BLOCK_N=64, BLOCK_D=block_d, SOFTCAP=softcap > 0, HAS_WINDOW=window > 0,
        HAS_FIRSTS=firsts is not None,
    )  # fmt: skip
    return out
