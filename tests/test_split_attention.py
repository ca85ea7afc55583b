"""The split-K decode attention's algorithm in plain PyTorch (aotc/kernels/split_attention.py, the
CPU reference of the CUDA kernel) against the unsplit attention it replaces
(aotc/export/cached_attention.py's reference): rows at different positions, prefill windows and
decode steps, grouped heads, a sliding window, soft-capping, padding tokens, a head size that is
not a power of two, a context shorter than the spans; and the launch rule's split counts."""

from __future__ import annotations

import pytest
import torch

from aotc.export.cached_attention import reference
from aotc.kernels.split_attention import BLOCK_N, MAX_SPLITS, split_attention, split_count


@pytest.mark.parametrize("splits", [1, 2, 3, 16])
@pytest.mark.parametrize(
    "heads, kv_heads, dim, steps, window, softcap",
    [(4, 4, 64, 1, 0, 0.0), (8, 2, 16, 1, 0, 0.0), (4, 2, 80, 7, 0, 0.0), (4, 2, 16, 5, 70, 0.0),
     (4, 1, 32, 3, 0, 30.0)],
)  # fmt: skip
def test_the_spans_combined_attend_as_the_whole_context(
    heads, kv_heads, dim, steps, window, softcap, splits
):
    g = torch.Generator().manual_seed(0)
    batch, length = 3, 300
    cache = (batch, length + 1, kv_heads, dim)
    keys, values = torch.randn(cache, generator=g), torch.randn(cache, generator=g)
    query = torch.randn(batch, heads, steps, dim, generator=g)
    # row 0 at the cache's start, row 1 past several spans' blocks, row 2 near the cache's end
    starts = torch.tensor([0, 2 * BLOCK_N + 5, length - steps])
    firsts = torch.tensor([0, min(2, steps - 1), 0])  # row 1's first tokens are padding
    args = (query, keys, values, starts, dim**-0.5, window, softcap, firsts)
    expected = reference(*args)
    got = split_attention(*args, splits)
    assert got.shape == expected.shape == (batch, steps, heads, dim)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if firsts[1] > 0:  # a padding token attends to nothing: 0, as the reference writes it
        assert got[1, : firsts[1]].abs().max() == 0


def test_a_span_past_the_context_weighs_nothing():
    """Four positions in context, 16 spans of a whole block each: one span holds them all, the
    other 15 are empty (maximum -inf, sum 0) and must not change the output."""
    g = torch.Generator().manual_seed(1)
    keys, values = torch.randn(1, 65, 2, 8, generator=g), torch.randn(1, 65, 2, 8, generator=g)
    query = torch.randn(1, 2, 1, 8, generator=g)
    args = (query, keys, values, torch.tensor([3]), 0.3, 0, 0.0, None)
    torch.testing.assert_close(split_attention(*args, 16), reference(*args), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "batch, heads, splits",
    [(1, 9, 16), (1, 32, 8), (1, 24, 16), (8, 32, 1), (4, 16, 4), (2, 8, 16), (64, 64, 1)],
)
def test_the_split_count_fills_the_gpu_and_no_more(batch, heads, splits):
    """At least 256 programs where MAX_SPLITS allows, a power of two, one span when the batch's
    heads already fill the GPU."""
    assert split_count(batch, heads) == splits
    assert splits == MAX_SPLITS or batch * heads * splits >= 256 or splits == 1
