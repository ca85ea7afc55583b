"""The split-K decode attention's algorithm in plain PyTorch (aotc/kernels/split_attention.py, the
CPU reference of the CUDA kernel) against the unsplit attention it replaces
(aotc/export/cached_attention.py's reference), and the CPU's windowed attention (`prefix`) against
it: packed tokens of rows at different positions, prefill chunks beside decode tokens, grouped
heads, a sliding window, soft-capping, tokens that are no row's, a head size that is not a power
of two, a context shorter than the spans; the launch rule's split counts; and the rule that sends a
join step's whole blocks of one row's tokens to the tiled kernel."""

from __future__ import annotations

import pytest
import torch
from join_steps import JOINS, LENGTH, join_feeds

from aotc.export.cached_attention import prefix, reference
from aotc.kernels.split_attention import (
    BLOCK_M,
    BLOCK_N,
    MAX_SPLITS,
    split_attention,
    split_count,
    tiled_tokens,
)
from aotc_runtime.decode_step import pack


def packed_case(heads, kv_heads, dim, steps, seed=0):
    """(query, keys, values, rows, positions) of a step over a cache of 4 rows: row 0 fed `steps`
    tokens at the cache's start, row 1 one token past several spans' blocks, row 2 `steps` tokens
    near the cache's end, row 3 a token that is no row's (at the cache's length)."""
    g = torch.Generator().manual_seed(seed)
    batch, length = 4, 300
    cache = (batch, length + 1, kv_heads, dim)
    keys, values = torch.randn(cache, generator=g), torch.randn(cache, generator=g)
    feeds = [(0, 0, [0] * steps), (1, 2 * BLOCK_N + 5, [0]), (2, length - steps, [0] * steps),
             (3, length, [0])]  # fmt: skip
    _ids, rows, positions, _picks = pack(feeds)
    query = torch.randn(1, heads, rows.shape[0], dim, generator=g)
    return query, keys, values, rows, positions


CASES = [(4, 4, 64, 1, 0, 0.0), (8, 2, 16, 1, 0, 0.0), (4, 2, 80, 7, 0, 0.0), (4, 2, 16, 5, 70, 0.0),
         (4, 1, 32, 3, 0, 30.0)]  # fmt: skip


@pytest.mark.parametrize("splits", [1, 2, 3, 16])
@pytest.mark.parametrize("heads, kv_heads, dim, steps, window, softcap", CASES)
def test_the_spans_combined_attend_as_the_whole_context(
    heads, kv_heads, dim, steps, window, softcap, splits
):
    query, keys, values, rows, positions = packed_case(heads, kv_heads, dim, steps)
    args = (query, keys, values, rows, positions, dim**-0.5, window, softcap)
    expected = reference(*args)
    got = split_attention(*args, splits)
    assert got.shape == expected.shape == (1, rows.shape[0], heads, dim)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert got[0, -1].abs().max() == 0  # the token that is no row's attends to nothing


@pytest.mark.parametrize("heads, kv_heads, dim, steps, window, softcap", CASES)
def test_the_cpus_windows_attend_as_the_reference(heads, kv_heads, dim, steps, window, softcap):
    """`prefix` lays the packed tokens out as one window per row and reads each over the cache's
    first positions only: the same output, the token that is no row's 0."""
    query, keys, values, rows, positions = packed_case(heads, kv_heads, dim, steps, seed=1)
    args = (query, keys, values, rows, positions, dim**-0.5, window, softcap)
    torch.testing.assert_close(prefix(*args), reference(*args), rtol=1e-5, atol=1e-5)
    # the tokens of one row in another order of the rows
    order = torch.tensor([steps, *range(steps), *range(steps + 1, rows.shape[0])])
    shuffled = (query[:, :, order], keys, values, rows[order], positions[order])
    torch.testing.assert_close(
        prefix(*shuffled, dim**-0.5, window, softcap),
        reference(*args)[:, order],
        rtol=1e-5,
        atol=1e-5,
    )


def test_a_span_past_the_context_weighs_nothing():
    """Four positions in context, 16 spans of a whole block each: one span holds them all, the
    other 15 are empty (maximum -inf, sum 0) and must not change the output."""
    g = torch.Generator().manual_seed(1)
    keys, values = torch.randn(1, 65, 2, 8, generator=g), torch.randn(1, 65, 2, 8, generator=g)
    query = torch.randn(1, 2, 1, 8, generator=g)
    args = (query, keys, values, torch.tensor([0]), torch.tensor([3]), 0.3, 0, 0.0)
    torch.testing.assert_close(split_attention(*args, 16), reference(*args), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "batch, heads, splits",
    [(1, 9, 8), (1, 32, 8), (1, 24, 8), (1, 64, 4), (8, 32, 1), (4, 16, 4), (2, 8, 8), (64, 64, 1)],
)
def test_the_split_count_fills_the_gpu_and_no_more(batch, heads, splits):
    """At least 256 programs where MAX_SPLITS allows, a power of two, one span when the batch's
    heads already fill the GPU."""
    assert split_count(batch, heads) == splits
    assert splits == MAX_SPLITS or batch * heads * splits >= 256 or splits == 1


def test_the_cpus_windows_take_a_step_no_generation_makes():
    """Rows whose positions are not consecutive, repeated or out of order (random inputs, not a
    generation's step): `prefix` returns an output of the step's shape, every value finite, and
    indexes nothing outside its windows."""
    g = torch.Generator().manual_seed(3)
    keys, values = torch.randn(3, 41, 2, 8, generator=g), torch.randn(3, 41, 2, 8, generator=g)
    query = torch.randn(1, 4, 6, 8, generator=g)
    rows = torch.tensor([2, 0, 2, 1, 0, 2])
    positions = torch.tensor([30, 3, 1, 40, 3, 7])
    out = prefix(query, keys, values, rows, positions, 0.3, 0, 0.0)
    assert out.shape == (1, 6, 4, 8) and bool(out.isfinite().all())
    assert out[0, 3].abs().max() == 0  # position 40 is the cache's length: no row's


@pytest.mark.parametrize("chunk, start, before, tiled", JOINS)
def test_a_tiled_block_is_one_rows_own_tokens(chunk, start, before, tiled):
    """The join steps the GPU tests feed tile the blocks they say: whole blocks of BLOCK_M packed
    tokens whose tokens are all one row's, at consecutive positions below the cache's length;
    never a decode token, a block across two rows or one of tokens that are no row's."""
    _ids, rows, positions, _picks = pack(join_feeds(chunk, start, before))
    chosen = tiled_tokens(rows, positions, LENGTH)
    assert int(chosen.sum()) == tiled
    for block in chosen.nonzero()[:, 0].view(-1, BLOCK_M):  # whole blocks, in order
        assert int(block[0]) % BLOCK_M == 0 and bool((block.diff() == 1).all())
        assert len(set(rows[block].tolist())) == 1 and int(rows[block[0]]) in (0, 1, 2)
        assert bool((positions[block].diff() == 1).all()) and int(positions[block[-1]]) < LENGTH


def test_a_decode_step_tiles_nothing():
    """One token a row (and rows fed nothing, at the cache's length): no block is one row's."""
    rows = torch.arange(128)
    positions = torch.where(rows % 3 == 0, 50, 10)
    assert not tiled_tokens(rows, positions, 50).any()
    assert not tiled_tokens(torch.zeros(64, dtype=torch.int64), torch.full((64,), 50), 50).any()
