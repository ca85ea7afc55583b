"""Falcon language model (FalconForCausalLM), tiny random config (multi-query attention: one key/value head,
parallel attention and MLP, rotary embeddings; bos/eos token ids inside the 512-word vocabulary), use_cache=False.

Inputs: input_ids, attention_mask (row 1 right-padded).
Returns CausalLMOutputWithPast: logits (B, S, 512).
"""

import torch
from transformers import FalconConfig, FalconForCausalLM

VOCAB = 512


def get_model():
    return FalconForCausalLM(
        FalconConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            use_cache=False,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (2, 16), generator=g)
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 12:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}
