"""Grouped-query attention over a static KV cache without copying the cache per query head.

transformers' SDPA attention (`integrations/sdpa_attention.py`) answers a model whose query heads
share key/value heads (Llama 3, Qwen2, Mistral: grouped-query attention) by `repeat_kv`: whenever
an attention mask is given, which a static cache always needs, each key/value head is copied once
per query head of its group before `scaled_dot_product_attention`. In a decode step of the
Llama-3.2-1B shape that is 8 MB written and read again per layer for one token of attention, and
the attention kernel then runs one query per head.

`grouped_sdpa` computes the same attention with the group's query heads stacked as rows of one
query per key/value head instead: query [B, H, S, D] viewed as [B, KV, G*S, D] (head h = kv*G + g,
the order repeat_kv gives), the mask repeated over the G row blocks. Every query row still meets
the same keys and values under the same mask: the same sums, with no copy of the cache, and a
decode step's attention becomes G query rows per head, the shape attention kernels are made for.
FlashAttention calls the idea "pack GQA"; ExecuTorch's exported LLMs avoid the copy the same way
with their own SDPA operator over the cache.

Registered as the attention implementation NAME (with SDPA's mask) and chosen at export for models
that use SDPA; anything it does not handle goes to transformers' own SDPA attention unchanged.
"""

from __future__ import annotations

from typing import Any

NAME = "aotc_sdpa"  # "sdpa" in the name: transformers checks the model supports SDPA for it


def grouped_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function contract: query [B, H, S, D], key/value [B, KV, L, D],
    a boolean or additive mask [B or 1, 1, S, L] -> (output [B, S, H, D], no weights)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = (
        groups == 1
        or attention_mask is None  # then SDPA's own enable_gqa applies, without a copy
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1  # a per-head mask
        or kwargs.get("position_bias") is not None
    )
    if plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    batch, heads, length, _ = query.shape
    kv_heads, kv_length = key.shape[1], key.shape[2]
    rows = query.reshape(batch, kv_heads, groups * length, query.shape[-1])
    mask = attention_mask[:, :, None].expand(-1, -1, groups, -1, -1)
    mask = mask.reshape(attention_mask.shape[0], 1, groups * length, kv_length)
    out = torch.nn.functional.scaled_dot_product_attention(
        rows, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    # [B, KV, G*S, D] -> [B, S, KV*G, D]; made contiguous first: a kernel may return another
    # layout, whose reshape over a dynamic S torch.export cannot prove a view
    out = out.contiguous().view(batch, kv_heads, groups, length, out.shape[-1])
    return out.permute(0, 3, 1, 2, 4).reshape(batch, length, heads, out.shape[-1]), None


def use_grouped_sdpa(model: Any) -> bool:
    """Switch a transformers model that attends with SDPA to `grouped_sdpa`; False (the model
    unchanged) when it attends another way or transformers refuses the switch."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    # a model whose attention modules do not look their function up by name cannot switch
    can_switch = getattr(model, "_can_set_attn_implementation", None)
    if can_switch is None or not can_switch():
        return False
    AttentionInterface.register(NAME, grouped_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, ImportError, AttributeError):
        return False
    return model.config._attn_implementation == NAME
