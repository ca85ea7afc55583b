"""aotc's attention over a generation step's KV cache: one operator, `aotc::cached_attention`, that
a generation package's every attention layer calls, and how a build lowers it for its device.

    cached_attention(query [B, Hq, S, D], keys [B, L + 1, Hkv, D], values [B, L + 1, Hkv, D],
                     starts [B], scale, window, softcap, firsts [B]) -> [B, S, Hq, D]

Each row of the batch has its own timeline: its window token j sits at position starts[b] + j and
attends to the cache positions up to that one (and, with a sliding window, to the last `window` of
them). Cache slot L is where the step writes the tokens it feeds no row (padding): never read.
Window tokens before firsts[b] are the row's padding: their output is 0, and they read nothing (a
row decoding one token beside a joining prompt's 256 would otherwise read its whole context 255
times over). Artifacts from before `firsts` hold none: every token is read then.
Query heads share key/value heads in groups of Hq / Hkv, as transformers' `repeat_kv` pairs them.

The operator is opaque to torch.export, so an artifact holds it as one node, and the build chooses
its implementation (`lower_cached_attention`):

- `reference`: masked attention over the whole cache. Exact and plain aten: the eager numeric
  check, the ONNX backend, and devices without a kernel of their own use it.
- `prefix` (the CPU): the same over the cache's first n positions only, n = the furthest position
  any row reaches in this step, read from the device as a number. A step with 64 tokens in context
  reads 64 positions whatever the cache's length. On a GPU that number would cost a device-to-host
  wait per step and change the graph's shapes, which CUDA-graph replay cannot.
- `kernel` (CUDA): a Triton kernel of aotc's own (aotc/kernels/attention.py) whose loop over the keys
  ends at each query's position: the same reads as `prefix` with shapes fixed for graph replay.
"""

from __future__ import annotations

from typing import Any

import torch

OP = "aotc::cached_attention"


def _allowed(starts: torch.Tensor, steps: int, length: int, window: int) -> torch.Tensor:
    """[B, S, length] booleans: which of the first `length` cache positions each query reads.
    A padding token's position can be below 0 (it sits before its row's first token): clamped to
    0, every query reads at least one position, so no row's softmax is over nothing."""
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
    [B, S, n]; [B, S, Hq, D]. Grouped key/value heads are expanded to the query's heads, as
    transformers' `repeat_kv` does: a copy of what is read. (Folding the query's groups into its
    tokens instead would read the cache once per key/value head, but a query split from a fused
    projection is strided [B, S, Hq, D], and that merge does not lower under a dynamic S.)"""
    batch, heads, steps, dim = query.shape
    kv_heads, length = keys.shape[2], keys.shape[1]
    group = heads // kv_heads
    # in the cache's dtype: a bf16 build can leave the query in fp32 (rotary embeddings are
    # computed in fp32), and the attention's inputs must agree
    q = query.to(keys.dtype)
    k = keys.transpose(1, 2)  # [B, Hkv, n, D]
    v = values.transpose(1, 2)
    if group > 1:
        expanded = (batch, kv_heads, group, length, dim)
        k = k[:, :, None].expand(expanded).reshape(batch, heads, length, dim)
        v = v[:, :, None].expand(expanded).reshape(batch, heads, length, dim)
    mask = allowed[:, None]  # [B, 1, S, n]
    if softcap > 0:  # Gemma 2: scores soft-capped before the mask, softmax in fp32 as transformers
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
        scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).to(query.dtype)


def _without_padding(out: torch.Tensor, firsts: torch.Tensor | None) -> torch.Tensor:
    """`out` [B, S, Hq, D] with each row's window tokens before firsts[b] at 0."""
    if firsts is None:
        return out
    padding = torch.arange(out.shape[1], device=out.device)[None, :] < firsts[:, None]
    return out.masked_fill(padding[:, :, None, None], 0)


def reference(query, keys, values, starts, scale: float, window: int, softcap: float, firsts=None):
    """Masked attention over the whole cache (slot L, padding's, left out)."""
    length = keys.shape[1] - 1
    allowed = _allowed(starts, query.shape[2], length, window)
    out = _attend(query, keys[:, :length], values[:, :length], allowed, scale, softcap)
    return _without_padding(out, firsts)


def prefix(query, keys, values, starts, scale: float, window: int, softcap: float, firsts=None):
    """The reference over the cache's first n positions, n the furthest any query reaches: what a
    step reads grows with its context, not with the cache's length."""
    if softcap > 0:  # Gemma 2's soft-capped scores do not lower over a dynamic length: all of it
        return reference(query, keys, values, starts, scale, window, softcap, firsts)
    length = keys.shape[1] - 1
    steps = query.shape[2]
    reach = (starts.max() + steps).clamp(min=1, max=length).item()
    torch._check(reach >= 1)
    torch._check(reach <= length)
    allowed = _allowed(starts, steps, reach, window)
    out = _attend(
        query, keys.narrow(1, 0, reach), values.narrow(1, 0, reach), allowed, scale, softcap
    )
    return _without_padding(out, firsts)


@torch.library.custom_op(OP, mutates_args=())
def cached_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
    firsts: torch.Tensor | None = None,
) -> torch.Tensor:
    return reference(query, keys, values, starts, scale, window, softcap, firsts).contiguous()


@cached_attention.register_fake
def _(query, keys, values, starts, scale, window, softcap, firsts=None):
    batch, heads, steps, dim = query.shape
    return query.new_empty(batch, steps, heads, dim)


def kernel(query, keys, values, starts, scale: float, window: int, softcap: float, firsts=None):
    """CUDA: aotc's Triton kernel (aotc/kernels/attention.py), which reads only the attended positions."""
    import aotc.kernels.attention  # noqa: F401 (registers aotc::cached_attention_cuda)

    return torch.ops.aotc.cached_attention_cuda(
        query, keys, values, starts, scale, window, softcap, firsts
    )


IMPLEMENTATIONS = {"reference": reference, "prefix": prefix, "kernel": kernel}


def implementation_for(device: str) -> str:
    """The implementation a build for `device` lowers the operator to (see the module's doc)."""
    return "prefix" if device == "cpu" else "kernel" if device.startswith("cuda") else "reference"


def holds_cached_attention(ep: Any) -> bool:
    target = torch.ops.aotc.cached_attention.default
    return any(node.target is target for node in ep.graph.nodes)


def lower_cached_attention(ep: Any, how: str) -> Any:
    """`ep` with every aotc::cached_attention replaced by the aten ops of implementation `how`."""
    if not holds_cached_attention(ep):
        return ep
    impl = IMPLEMENTATIONS[how]

    def decomposition(query, keys, values, starts, scale, window, softcap, firsts=None):
        return impl(query, keys, values, starts, scale, window, softcap, firsts).contiguous()

    return ep.run_decompositions({torch.ops.aotc.cached_attention.default: decomposition})
