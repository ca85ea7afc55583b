"""GPT-2 language model (GPT2LMHeadModel), tiny random config, use_cache=False.

Inputs: input_ids, attention_mask (row 1 right-padded).
Returns CausalLMOutputWithCrossAttentions: logits (B, S, 512).
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 512


def get_model():
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_positions=64,
            n_embd=64,
            n_layer=2,
            n_head=4,
            bos_token_id=VOCAB - 1,
            eos_token_id=VOCAB - 1,
            use_cache=False,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (2, 16), generator=g)
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 12:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}
