"""Join steps for the attention tests: a prompt's chunk packed among other rows' tokens, in the
layouts that decide which blocks of a step attention.py tiles (the rule is
aotc/kernels/split_attention.py's `tiled_tokens`, blocks of BLOCK_M = 64 packed tokens)."""

from __future__ import annotations

import torch

from aotc_runtime.decode_step import pack

BATCH, LENGTH = 8, 400  # the cache: 8 rows of 400 positions (and the padding's slot)
NO_ROWS = 128  # tokens of row 5 at the cache's length and past it: two blocks, one whole

# (the chunk's tokens, its first position, row 1's tokens packed before it, the step's tiled tokens)
JOINS = [
    (1, 0, 0, 0),  # a one-token chunk; row 2's 65 tokens fill no whole block either
    (63, 7, 0, 64),  # block 0 spans rows 0 and 2; block 1 is row 2's
    (64, 0, 0, 128),  # the chunk is block 0, row 2's first 64 block 1
    (64, 300, 64, 192),  # row 1's chunk, this one deep in its row, row 2's
    (65, 31, 3, 0),  # every block spans two rows
    (128, 200, 64, 256),  # two whole blocks of the chunk
    (300, 0, 10, 192),  # ragged at both ends: 54 tokens before its first block, 54 after
    (300, 90, 33, 256),  # ragged: 31 tokens, then four blocks, then 13
]


def join_feeds(chunk: int, start: int, before: int) -> list:
    """pack()'s feeds: row 1's `before` tokens from position 30, row 0's `chunk` tokens from
    `start`, row 2's 65 from 100 (so a block spans row 0 and row 2 wherever the chunk ends),
    decode tokens of rows 3 and 4 (row 4's at the cache's last position), NO_ROWS tokens of row 5
    that are no row's, and one of row 6."""
    feeds = [(1, 30, [0] * before)] if before else []
    feeds += [(0, start, [0] * chunk), (2, 100, [0] * 65), (3, 40, [0]), (4, LENGTH - 1, [0])]
    return feeds + [(5, LENGTH, [0] * NO_ROWS), (6, LENGTH, [0])]


def join_step(chunk, start, before, heads, kv_heads, dim, dtype, device, seed=0):
    """(query [1, Hq, T, D] strided as a fused projection leaves it, keys, values, rows, positions)
    of `join_feeds` over a cache of random keys and values."""
    g = torch.Generator(device=device).manual_seed(seed)
    cache = (BATCH, LENGTH + 1, kv_heads, dim)
    keys = torch.randn(cache, generator=g, device=device).to(dtype)
    values = torch.randn(cache, generator=g, device=device).to(dtype)
    _ids, rows, positions, _picks = (t.to(device) for t in pack(join_feeds(chunk, start, before)))
    query = torch.randn(1, rows.shape[0], heads, dim, generator=g, device=device).to(dtype)
    return query.transpose(1, 2), keys, values, rows, positions
