"""GPT-2 small language model (GPT2LMHeadModel(GPT2Config()): the default config is the 124M GPT-2),
random init, use_cache=False.

Inputs: input_ids (8, 128), attention_mask (8, 128) with row 1 right-padded.
Returns CausalLMOutputWithCrossAttentions: logits (8, 128, 50257).
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def get_model():
    return GPT2LMHeadModel(GPT2Config(use_cache=False))


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 50257, (8, 128), generator=g)
    attention_mask = torch.ones(8, 128, dtype=torch.int64)
    attention_mask[1, 100:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}
