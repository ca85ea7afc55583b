"""aotc's grouped-query SDPA (aotc/export/grouped_attention.py) against transformers' own SDPA
attention, which copies each key/value head per query head (repeat_kv) before attending."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from aotc.export.grouped_attention import NAME, grouped_sdpa, use_grouped_sdpa


class Attention(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def padded_causal_mask(batch: int, queries: int, keys: int, start: int) -> torch.Tensor:
    """[B, 1, S, L] booleans: query s (at position start + s) sees keys 0..start + s, and row 0
    does not see its first two keys (left padding)."""
    seen = torch.arange(keys)[None, :] <= (start + torch.arange(queries))[:, None]
    mask = seen[None, None].repeat(batch, 1, 1, 1)
    mask[0, :, :, :2] = False
    return mask


@pytest.mark.parametrize("queries", [1, 5])  # a decode step, a prefill
@pytest.mark.parametrize("groups", [1, 4])
def test_grouped_sdpa_equals_transformers_sdpa(queries, groups):
    g = torch.Generator().manual_seed(0)
    batch, kv_heads, keys, dim = 2, 2, 16, 8
    query = torch.randn(batch, kv_heads * groups, queries, dim, generator=g)
    key = torch.randn(batch, kv_heads, keys, dim, generator=g)
    value = torch.randn(batch, kv_heads, keys, dim, generator=g)
    mask = padded_causal_mask(batch, queries, keys, start=keys - queries - 3)
    module = Attention(groups)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    got, _ = grouped_sdpa(module, query, key, value, mask, scaling=0.3)
    assert got.shape == expected.shape == (batch, queries, kv_heads * groups, dim)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_a_grouped_query_model_is_switched_and_a_multi_head_one_attends_the_same():
    from transformers import LlamaConfig, LlamaForCausalLM

    def llama(kv_heads: int):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=4,
                             num_key_value_heads=kv_heads)  # fmt: skip
        return LlamaForCausalLM(config).eval()

    ids = torch.tensor([[3, 9, 27, 5, 11]])
    mask = torch.tensor([[0, 1, 1, 1, 1]])  # a padded row: SDPA gets a mask
    for kv_heads in (1, 4):
        model = llama(kv_heads)
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask).logits
        assert use_grouped_sdpa(model)
        assert model.config._attn_implementation == NAME
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
