"""Gemma 2 language model (Gemma2ForCausalLM), tiny random config (multi-query attention: 4 query heads, one
key/value head; head_dim 16; embeddings scaled by sqrt(hidden); a sliding-window layer (window 8, shorter than
prompt + new tokens, so it limits attention) then a global one; attention and final-logit soft-capping),
use_cache=False. Embeddings untied: tied, the scaled embedding of the last token outweighs the rest and the
random model repeats that token.

Inputs: input_ids, attention_mask (row 1 right-padded).
Returns CausalLMOutputWithPast: logits (B, S, 512).
"""

import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

VOCAB = 512


def get_model():
    return Gemma2ForCausalLM(
        Gemma2Config(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=8,
            tie_word_embeddings=False,
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
