"""DistilBERT with a token classification head (DistilBertForTokenClassification, 5 labels), tiny random config.

Inputs: input_ids, attention_mask (row 1 padded at the end).
Returns TokenClassifierOutput: logits (B, S, 5).
"""

import torch
from transformers import DistilBertConfig, DistilBertForTokenClassification

VOCAB = 1000


def get_model():
    return DistilBertForTokenClassification(
        DistilBertConfig(
            vocab_size=VOCAB,
            dim=64,
            n_layers=2,
            n_heads=4,
            hidden_dim=128,
            max_position_embeddings=64,
            num_labels=5,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (2, 16), generator=g)
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 13:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}
