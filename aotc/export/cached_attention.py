"""aotc's attention over a generation step's KV cache: one operator, `aotc::cached_attention`, that
a generation package's every attention layer calls, and how a build lowers it for its device.

    cached_attention(query [1, Hq, T, D], keys [B, L + 1, Hkv, D], values [B, L + 1, Hkv, D],
                     rows [T], positions [T], scale, window, softcap) -> [1, T, Hq, D]

A step's tokens are packed (row_cache.py): token t belongs to cache row rows[t], at position
positions[t], and attends to that row's positions up to its own (and, with a sliding window, to the
last `window` of them). A token at position L or past it is no row's (a decode step's free row):
it reads nothing and its output is 0. Cache slot L is where such tokens are written: never read.
A row's tokens in one step sit at consecutive positions. Query heads share key/value heads in
groups of Hq / Hkv, as transformers' `repeat_kv` pairs them.

The operator is opaque to torch.export, so an artifact holds it as one node, and the build chooses
its implementation (`lower_cached_attention`):

- `reference`: every token against every row's cache, masked to its own row's positions. Exact,
  plain aten and of static shapes: the eager numeric check, the ONNX backend, and devices without
  a kernel of their own use it. It computes B times the scores a token needs.
- `prefix` (the CPU): the step's tokens laid out as one window per row (a row's tokens at the
  window's end, as many columns as the row fed the most), and each row's window over the cache's
  first n positions only, n = the furthest position any token reaches, both read from the device
  as numbers. A decode step reads each row's context once; a prefill chunk computes its row's
  attention as one product. On a GPU those numbers would cost a device-to-host wait per step and
  change the graph's shapes, which CUDA-graph replay cannot.
- `kernel` (CUDA): Triton kernels of aotc's own (aotc/kernels/attention.py), one program per token
  and head whose loop over the keys ends at the token's position, and one per whole block of 64
  tokens of one row (a joining prompt's chunk) and head that reads the row's keys once for the
  block: the reads `prefix` makes, with shapes fixed for graph replay.
"""

from __future__ import annotations

from typing import Any

import torch

OP = "aotc::cached_attention"


def _allowed(starts: torch.Tensor, steps: int, length: int, window: int) -> torch.Tensor:
    """[B, S, length] booleans: which of the first `length` cache positions each window query
    reads. A padding token's position can be below 0 (it sits before its row's first token):
    clamped to 0, every query reads at least one position, so no row's softmax is over nothing."""
    query = starts[:, None] + torch.arange(steps, device=starts.device)  # [B, S]
    keys = torch.arange(length, device=starts.device)
    last = query.clamp(min=0)[:, :, None]
    allowed = keys[None, None, :] <= last
    if window > 0:
        allowed = allowed & (keys[None, None, :] > last - window)
    return allowed


def packed_allowed(
    rows: torch.Tensor, positions: torch.Tensor, batch: int, length: int, window: int
) -> torch.Tensor:
    """[T, B * (length + 1)] booleans: which slots of the whole cache, its rows laid end to end
    (slot `length` of each the padding's), each packed token reads. A token that is no row's reads
    slot 0 of row 0 (no softmax over nothing; its output is zeroed)."""
    own = positions < length
    row = torch.where(own, rows, 0)
    last = torch.where(own, positions, 0)[:, None]
    slots = torch.arange(length + 1, device=rows.device)
    in_row = slots[None, :] <= last
    if window > 0:
        in_row = in_row & (slots[None, :] > last - window)
    cache_rows = torch.arange(batch, device=rows.device)
    same = cache_rows[None, :, None] == row[:, None, None]  # [T, B, 1]
    return (same & in_row[:, None, :]).reshape(rows.shape[0], batch * (length + 1))


def _expand_heads(cache: torch.Tensor, heads: int) -> torch.Tensor:
    """[N, Hkv, D] -> [Hq, N, D]: each key/value head repeated for its group of query heads, as
    transformers' `repeat_kv` does (a copy of what is read)."""
    n, kv_heads, dim = cache.shape
    group = heads // kv_heads
    expanded = cache.transpose(0, 1)
    if group > 1:
        expanded = expanded[:, None].expand(kv_heads, group, n, dim).reshape(heads, n, dim)
    return expanded


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
    projection is strided, and that merge does not lower under a dynamic size.)"""
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
        out = _scaled_dot_product(q, k, v, mask, scale)
    return out.transpose(1, 2).to(query.dtype)


def _scaled_dot_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q k^T * scale where `mask` [B, 1, S, n]) v, as scaled_dot_product_attention
    computes it. A batch read from the device (`prefix`'s windows, traced for the CPU) calls the
    kernel that function picks on the CPU, flash attention, itself, with the boolean mask made
    additive as that function makes it: the same numbers. On torch 2.11 that function's choice of
    kernel guards on whether the mask's batch is 1, which such a batch cannot answer while
    tracing."""
    # eager calls, and the reference (a static batch; the ONNX backend exports it), keep it
    if q.device.type != "cpu" or not isinstance(q.shape[0], torch.SymInt):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale
        )
    blocked = torch.scalar_tensor(float("-inf"), dtype=q.dtype, device=q.device)
    additive = torch.where(mask, 0.0, blocked)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    return flash(q, k, v, attn_mask=additive, scale=scale)[0]


def _zero_unowned(out: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    """`out` [1, T, Hq, D] with the tokens that are no row's at 0."""
    return out.masked_fill((positions >= length)[None, :, None, None], 0)


def reference(query, keys, values, rows, positions, scale: float, window: int, softcap: float):
    """Every token against the whole cache, its rows end to end, masked to its own row."""
    batch, slots, kv_heads, dim = keys.shape
    length = slots - 1
    allowed = packed_allowed(rows, positions, batch, length, window)
    # [B, L + 1, Hkv, D] -> one row of B * (L + 1) slots: a view of the buffers
    flat_keys = keys.reshape(1, batch * slots, kv_heads, dim)
    flat_values = values.reshape(1, batch * slots, kv_heads, dim)
    out = _attend(query, flat_keys, flat_values, allowed[None], scale, softcap)
    return _zero_unowned(out, positions, length)


def windows(rows: torch.Tensor, positions: torch.Tensor, length: int, fed: torch.Tensor, steps):
    """The packed tokens as one window of `steps` columns per cache row, each row's tokens at its
    window's end: (each token's column [T], each row's window start position [B], each row's first
    column it is fed [B]). `fed` [B]: the tokens each row is fed. A token that is no row's takes
    its row's last column (whatever it holds there is not read: see `prefix`), and a row fed
    nothing has its whole window as padding."""
    own = positions < length
    lowest = torch.full_like(fed, length)
    lowest = lowest.scatter_reduce(0, rows, torch.where(own, positions, length), "amin")
    firsts = steps - fed
    # a row fed nothing starts `steps` before 0: every query of it clamps to position 0
    starts = torch.where(fed > 0, lowest - firsts, -steps)
    columns = torch.where(own, positions - starts[rows], steps - 1)
    # a row's positions that are not consecutive (not a generation's step) would reach past the
    # window: clamped, they give wrong outputs, never an index outside it
    return columns.clamp(min=0, max=steps - 1), starts, firsts


MARK_SIZES = torch.__version__ < "2.13"  # TorchVersion compares as a version


def _size(value: torch.Tensor, most: Any) -> Any:
    """`value`, one number from 1 to `most`, read from the device as a size: while tracing, an
    unknown (unbacked) one. On torch before 2.13 it is marked a size, so that Inductor, ordering
    the strides of the attention's inputs, assumes it is not 0 or 1 rather than guarding on which
    it is; later releases do not guard there, and 2.14 deprecates the marking."""
    size = value.item()
    if MARK_SIZES:
        torch._check_is_size(size)
    torch._check(size >= 1)
    torch._check(size <= most)
    return size


def _prefix_windows(q, keys, values, starts, scale, window, softcap, firsts, steps):
    """Each row's window [B, Hq, S, D] over the cache's first n positions, n the furthest any
    query reaches: what a step reads grows with its context, not with the cache's length."""
    length = keys.shape[1] - 1
    reach = _size((starts.max() + steps).clamp(min=1, max=length), length)
    allowed = _allowed(starts, steps, reach, window)
    out = _attend(q, keys.narrow(1, 0, reach), values.narrow(1, 0, reach), allowed, scale, softcap)
    padding = torch.arange(steps, device=out.device)[None, :] < firsts[:, None]
    return out.masked_fill(padding[:, :, None, None], 0)


def prefix(query, keys, values, rows, positions, scale: float, window: int, softcap: float):
    """The packed tokens as windows (`windows`) over the first rows any token is in, each over
    the cache's first n positions (see the module's doc)."""
    if softcap > 0:  # Gemma 2's soft-capped scores do not lower over a dynamic length: all of it
        return reference(query, keys, values, rows, positions, scale, window, softcap)
    length = keys.shape[1] - 1
    own = positions < length
    used = _size((torch.where(own, rows, 0).max() + 1).clamp(max=keys.shape[0]), keys.shape[0])
    fed = torch.zeros(keys.shape[0], dtype=rows.dtype, device=rows.device)
    fed = fed.scatter_add(0, rows, own.to(rows.dtype))
    steps = _size(fed.max().clamp(min=1), query.shape[2])
    rows_in = torch.where(own, rows, 0).clamp(max=used - 1)
    columns, starts, firsts = windows(rows_in, positions, length, fed.narrow(0, 0, used), steps)
    heads, dim = query.shape[1], query.shape[3]
    tokens = query[0].transpose(0, 1)  # [T, Hq, D]
    # each row's own tokens at their columns (one token per column); a token that is no row's
    # adds 0 wherever it lands
    placed = tokens.masked_fill(~own[:, None, None], 0)
    laid = tokens.new_zeros(used, steps, heads, dim).index_put(
        (rows_in, columns), placed, accumulate=True
    )
    out = _prefix_windows(
        laid.transpose(1, 2), keys.narrow(0, 0, used), values.narrow(0, 0, used),
        starts, scale, window, softcap, firsts, steps,
    )  # fmt: skip
    picked = out[rows_in, columns][None]  # [1, T, Hq, D]
    return _zero_unowned(picked, positions, length)


@torch.library.custom_op(OP, mutates_args=())
def cached_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
) -> torch.Tensor:
    return reference(query, keys, values, rows, positions, scale, window, softcap).contiguous()


@cached_attention.register_fake
def _(query, keys, values, rows, positions, scale, window, softcap):
    _one, heads, tokens, dim = query.shape
    return query.new_empty(1, tokens, heads, dim)


def kernel(query, keys, values, rows, positions, scale: float, window: int, softcap: float):
    """CUDA: aotc's Triton kernel (aotc/kernels/attention.py), which reads only the attended positions."""
    import aotc.kernels.attention  # noqa: F401 (registers aotc::cached_attention_cuda)

    return torch.ops.aotc.cached_attention_cuda(
        query, keys, values, rows, positions, scale, window, softcap
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

    def decomposition(query, keys, values, rows, positions, scale, window, softcap):
        return impl(query, keys, values, rows, positions, scale, window, softcap).contiguous()

    return ep.run_decompositions({torch.ops.aotc.cached_attention.default: decomposition})
