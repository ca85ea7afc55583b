"""Cohere (Command-R) language model (CohereForCausalLM), tiny random config (GQA 4/2 heads, parallel
attention and MLP, LayerNorm, interleaved rotary embeddings, scaled logits; eos token id moved inside the
512-word vocabulary), use_cache=False.

Inputs: input_ids, attention_mask (row 1 right-padded).
Returns CausalLMOutputWithPast: logits (B, S, 512).
"""

import torch
from transformers import CohereConfig, CohereForCausalLM

VOCAB = 512


def get_model():
    return CohereForCausalLM(
        CohereConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            eos_token_id=VOCAB - 1,
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
