"""RoBERTa-base for sequence classification (RobertaForSequenceClassification(RobertaConfig()):
roberta-base's shape, 125M parameters), random init. One of the five transformers
models of the zoo's bf16 CUDA table (docs/models.md), with dynamic batch and sequence length.

Inputs: input_ids (8, 128), attention_mask (8, 128) with row 1 padded at the end.
Returns SequenceClassifierOutput: logits (8, 2).
"""

import torch
from transformers import RobertaConfig, RobertaForSequenceClassification


def get_model():
    return RobertaForSequenceClassification(RobertaConfig(vocab_size=50265))


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 50265, (8, 128), generator=g)
    attention_mask = torch.ones(8, 128, dtype=torch.int64)
    attention_mask[1, 100:] = 0
    input_ids[1, 100:] = 1  # pad_token_id
    return {"input_ids": input_ids, "attention_mask": attention_mask}
