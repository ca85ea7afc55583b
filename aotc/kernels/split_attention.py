"""The split-K decode attention of attention.py without Triton: its launch-shape rule and its
algorithm in plain PyTorch, which CI runs on the CPU (the kernel needs CUDA).

`split_attention` computes what the split kernel computes, in the same steps: the positions each
(packed token, query head) attends to in its row, [first, stop), cut into `splits` spans of whole
BLOCK_N blocks (the last one shorter, some empty); per span, the maximum score, the sum of
exp(score - maximum) and the values weighted by it; then the spans combined, each weighted by
exp(its maximum - the largest), an empty span (maximum -inf, sum 0) by nothing, and a token that
attends to nothing (no row's) written as 0. Held to the unsplit attention (cached_attention.reference)
in tests/test_split_attention.py, and the Triton kernels to it in tests/test_gpu_attention.py.

`tiled_tokens` is the rule that sends a token to attention.py's tiled kernel instead: the step's
tokens in blocks of BLOCK_M from the first, a block tiled when it is whole and its first and last
tokens are one row's own (position below the cache's length). A row's tokens in a step are
consecutive and at consecutive positions, so a tiled block is BLOCK_M queries at consecutive
positions of one row: one program reads the row's keys once for all of them. The tiled kernel
computes the same attention (one span, the whole context), so split_attention stays the reference
of every token's output.
"""

from __future__ import annotations

import torch

# programs a layer's attention should have to fill an H100/H200 (132 SMs, a few programs each)
TARGET_PROGRAMS = 256
# at most 8 spans: with the last span combining (attention.py), SmolLM2-135M's 9 heads in 16 spans
# decoded 2-12% slower than in 8 on an H200 over 32-320 cached positions, the 1B's and
# Qwen3-0.6B's shapes within 2%, and 10.6% faster over 700-988 (docs/benchmarks.md). Those 16 spans
# each stored and counted, empty or not; now only the spans a context fills do, which is what a
# short context's 16 spans lost by, so 16 is the count to measure next
MAX_SPLITS = 8
BLOCK_N = 64  # the keys a program reads per iteration; spans are whole blocks of it
# the packed tokens a tiled program takes: a whole tensor-core tile of queries (Hopper's smallest
# warpgroup product is 64 rows)
BLOCK_M = 64


def traced_size(size) -> int:
    """`size` as an int for a launch choice. A dynamic size gives its traced example, read without
    guarding on it, so the choice stays one per package."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return hint if isinstance(hint, int) else 1


def split_count(batch: int, heads: int) -> int:
    """Spans each (row, head, token)'s context is split into: enough programs for the GPU at a
    decode step, one span when the batch's heads already fill it (a power of two, at most
    MAX_SPLITS)."""
    wanted = -(-TARGET_PROGRAMS // max(batch * heads, 1))
    return max(1, min(MAX_SPLITS, 1 << (wanted - 1).bit_length()))


def tiled_tokens(
    rows: torch.Tensor, positions: torch.Tensor, length: int, block_m: int = BLOCK_M
) -> torch.Tensor:
    """[T] booleans: which packed tokens the tiled kernel serves (the module's doc), as the kernels
    decide it on the device from the block's first and last tokens."""
    tokens = rows.shape[0]
    block = torch.arange(tokens, device=rows.device) // block_m
    head = block * block_m
    tail = head + block_m - 1
    whole = tail < tokens
    tail = tail.clamp(max=tokens - 1)
    one_row = rows[head] == rows[tail]
    own = (positions[head] < length) & (positions[tail] < length)
    return whole & one_row & own


def split_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
    splits: int,
) -> torch.Tensor:
    """The packed tokens `query` [1, Hq, T, D] over the cache keys/values [B, L + 1, Hkv, D] (slot
    L the padding's), token t in row rows[t] at positions[t] (L or past it: no row's); [1, T, Hq, D]
    in the query's dtype, computed in fp32 as the kernels do."""
    _one, heads, tokens, dim = query.shape
    length, kv_heads = keys.shape[1] - 1, keys.shape[2]
    group = heads // kv_heads
    # each token's own position, and the positions it attends to: [first, stop)
    own = positions < length
    last = torch.where(own, positions, 0)
    first = (last - window + 1).clamp(min=0) if window > 0 else torch.zeros_like(last)
    stop = torch.where(own, last + 1, first)
    chunk = _ceil_div(_ceil_div(stop - first, splits), BLOCK_N) * BLOCK_N  # [T]
    row = torch.where(own, rows, 0)
    k = keys[row, :length].float().repeat_interleave(group, dim=2)  # [T, L, Hq, D]
    v = values[row, :length].float().repeat_interleave(group, dim=2)
    scores = torch.einsum("htd,tnhd->thn", query[0].float() * scale, k)  # [T, Hq, L]
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    slots = torch.arange(length, device=query.device)
    maxima, sums, weighted = [], [], []
    for split in range(splits):
        lo = first + split * chunk
        hi = torch.minimum(lo + chunk, stop)
        inside = (slots >= lo[:, None]) & (slots < hi[:, None])  # [T, L]
        span = scores.masked_fill(~inside[:, None], float("-inf"))
        top = span.amax(dim=-1, keepdim=True)  # -inf for an empty span
        p = torch.exp(span - top.where(top > float("-inf"), 0.0))
        maxima.append(top[..., 0])
        sums.append(p.sum(dim=-1))
        weighted.append(torch.einsum("thn,tnhd->thd", p, v))
    top = torch.stack(maxima).amax(dim=0)
    out = torch.zeros_like(weighted[0])
    total = torch.zeros_like(sums[0])
    for m, s, acc in zip(maxima, sums, weighted):
        weight = torch.where(s > 0, torch.exp(m - top), torch.zeros_like(s))
        total = total + s * weight
        out = out + acc * weight[..., None]
    out = torch.where(total[..., None] > 0, out / total.clamp(min=1e-30)[..., None], 0.0)
    return out[None].to(query.dtype)


def _ceil_div(a: torch.Tensor, b: int | torch.Tensor) -> torch.Tensor:
    return torch.div(a + b - 1, b, rounding_mode="floor")
