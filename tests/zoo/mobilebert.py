"""MobileBERT encoder (MobileBertModel), tiny random config (bottleneck 32 inside a 64-wide trunk).

Inputs: input_ids, attention_mask (row 1 padded at the end), token_type_ids.
Returns BaseModelOutputWithPooling: last_hidden_state (B, S, 64), pooler_output (B, 64).
"""

import torch
from transformers import MobileBertConfig, MobileBertModel

VOCAB = 1000


def get_model():
    return MobileBertModel(
        MobileBertConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            embedding_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            intra_bottleneck_size=32,
            true_hidden_size=32,
            num_feedforward_networks=2,
            max_position_embeddings=64,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (2, 16), generator=g)
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 12:] = 0
    token_type_ids = torch.zeros(2, 16, dtype=torch.int64)
    token_type_ids[:, 8:] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
    }
