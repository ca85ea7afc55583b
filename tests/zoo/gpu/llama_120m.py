"""A 120M LlamaForCausalLM (GQA: 12 heads, 4 key-value heads), random init, use_cache=False: the
model whose bf16 and fp16 builds once failed their check.

Inputs: input_ids (4, 256), attention_mask (4, 256) with row 1 padded at the end.
Returns CausalLMOutputWithPast: logits (4, 256, 32000).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def get_model():
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        use_cache=False,
    )
    return LlamaForCausalLM(config)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 32000, (4, 256), generator=g)
    attention_mask = torch.ones(4, 256, dtype=torch.int64)
    attention_mask[1, 200:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}
