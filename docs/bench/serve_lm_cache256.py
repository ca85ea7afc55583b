"""The zoo's tiny GPT-2 (2 layers, 64 wide) with 512 positions: room for a serving cache."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def get_model():
    torch.manual_seed(0)
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=512,
            n_positions=512,
            n_embd=64,
            n_layer=2,
            n_head=4,
            bos_token_id=511,
            eos_token_id=511,
        )
    )
