"""aotc's attention over a generation step's KV cache: one operator, `aotc::cached_attention`, that
a generation package's every attention layer calls, and how a build lowers it for its device.

    cached_attention(query [B, Hq, S, D], keys [B, L + 1, Hkv, D], values [B, L + 1, Hkv, D],
                     starts [B], scale, window, softcap) -> [B, S, Hq, D]

Each row of the batch has its own timeline: its window token j sits at position starts[b] + j and
attends to the cache positions up to that one (and, with a sliding window, to the last `window` of
them). Cache slot L is where the step writes the tokens it feeds no row (padding): never read.
Query heads share key/value heads in groups of Hq / Hkv, as transformers' `repeat_kv` pairs them.

The operator is opaque to torch.export, so an artifact holds it as one node, and the build chooses
its implementation (`lower_cached_attention`):

- `reference`: masked attention over the whole cache. Exact and plain aten: the eager numeric
  check, the ONNX backend, and devices without a kernel of their own use it.
- `prefix` (the CPU): the same over the cache's first n positions only, n = the furthest position
  any row reaches in this step, read from the device as a number. A step with 64 tokens in context
  reads 64 positions whatever the cache's length. On a GPU that number would cost a device-to-host
  wait per step and change the graph's shapes, which CUDA-graph replay cannot.
"""

from __future__ import annotations

from typing import Any

import torch

OP = "aotc::cached_attention"


def _allowed(starts: torch.Tensor, steps: int, length: int, window: int) -> torch.Tensor:
    """[B, S, length] booleans: which of the first `length` cache positions each query reads.
    A query's position is clamped into the cache (a padding token can sit past it): every query
    then reads at least one position, so no row's softmax is over nothing."""
    query = starts[:, None] + torch.arange(steps, device=starts.device)  # [B, S]
    keys = torch.arange(length, device=starts.device)
    last = query.clamp(min=0)[:, :, None]
    allowed = keys[None, None, :] <= last
    if window > 0:
        allowed = allowed & (keys[None, None, :] > last - window)
    return allowed


def _attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    """Attention of `query` [B, Hq, S, D] over `keys`/`values` [B, n, Hkv, D] where `allowed`
    [B, S, n]; [B, S, Hq, D]. The query heads are grouped by their key/value head ([B, Hkv,
    G * S, D]), so the cache is read once per key/value head, never copied per query head."""
    batch, heads, steps, dim = query.shape
    kv_heads = keys.shape[2]
    group = heads // kv_heads
    # The scale applied to the query first: a new tensor, which Inductor lays out as the merge of
    # heads and tokens below needs (a query split from a fused projection is strided as
    # [B, S, Hq, D], and a plain reshape of it fails to lower under a dynamic S), and in the
    # cache's dtype (a bf16 build can leave it fp32: rotary embeddings are computed in fp32).
    q = torch.mul(query.to(keys.dtype), scale).reshape(batch, kv_heads, group * steps, dim)
    k = keys.transpose(1, 2)  # [B, Hkv, n, D]
    v = values.transpose(1, 2)
    mask = allowed[:, None, None].expand(batch, 1, group, steps, allowed.shape[-1])
    mask = mask.reshape(batch, 1, group * steps, allowed.shape[-1])
    if softcap > 0:  # Gemma 2: scores soft-capped before the mask, softmax in fp32 as transformers
        scores = torch.matmul(q, k.contiguous().transpose(-1, -2)).float()
        scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v.contiguous())
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    return out.reshape(batch, heads, steps, dim).transpose(1, 2).to(query.dtype)


def reference(query, keys, values, starts, scale: float, window: int, softcap: float):
    """Masked attention over the whole cache (slot L, padding's, left out)."""
    length = keys.shape[1] - 1
    allowed = _allowed(starts, query.shape[2], length, window)
    return _attend(query, keys[:, :length], values[:, :length], allowed, scale, softcap)


def prefix(query, keys, values, starts, scale: float, window: int, softcap: float):
    """The reference over the cache's first n positions, n the furthest any query reaches: what a
    step reads grows with its context, not with the cache's length."""
    length = keys.shape[1] - 1
    steps = query.shape[2]
    reach = (starts.max() + steps).clamp(min=1, max=length).item()
    torch._check(reach >= 1)
    torch._check(reach <= length)
    allowed = _allowed(starts, steps, reach, window)
    return _attend(
        query, keys.narrow(1, 0, reach), values.narrow(1, 0, reach), allowed, scale, softcap
    )


@torch.library.custom_op(OP, mutates_args=())
def cached_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
) -> torch.Tensor:
    return reference(query, keys, values, starts, scale, window, softcap).contiguous()


@cached_attention.register_fake
def _(query, keys, values, starts, scale, window, softcap):
    batch, heads, steps, dim = query.shape
    return query.new_empty(batch, steps, heads, dim)


IMPLEMENTATIONS = {"reference": reference, "prefix": prefix}


def implementation_for(device: str) -> str:
    """The implementation a build for `device` lowers the operator to (see the module's doc)."""
    return "prefix" if device == "cpu" else "reference"


def holds_cached_attention(ep: Any) -> bool:
    target = torch.ops.aotc.cached_attention.default
    return any(node.target is target for node in ep.graph.nodes)


def lower_cached_attention(ep: Any, how: str) -> Any:
    """`ep` with every aotc::cached_attention replaced by the aten ops of implementation `how`."""
    if not holds_cached_attention(ep):
        return ep
    impl = IMPLEMENTATIONS[how]

    def decomposition(query, keys, values, starts, scale, window, softcap):
        return impl(query, keys, values, starts, scale, window, softcap).contiguous()

    return ep.run_decompositions({torch.ops.aotc.cached_attention.default: decomposition})
