"""Qwen2-MoE language model (Qwen2MoeForCausalLM), tiny random config: 4 experts, 2 per token, a
shared expert; use_cache=False.

Inputs: input_ids, attention_mask (row 1 right-padded).
Returns MoeCausalLMOutputWithPast: logits (B, S, 512).
"""

import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

VOCAB = 512


def get_model():
    return Qwen2MoeForCausalLM(
        Qwen2MoeConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            use_cache=False,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (2, 16), generator=g)
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 12:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}
