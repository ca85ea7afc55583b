"""BERT-base encoder (BertModel(BertConfig()): the default config is bert-base-uncased's shape,
110M parameters), random init.

Inputs: input_ids (8, 128), attention_mask (8, 128) with row 1 padded at the end.
Returns BaseModelOutputWithPoolingAndCrossAttentions: last_hidden_state (8, 128, 768), pooler_output (8, 768).
"""

import torch
from transformers import BertConfig, BertModel


def get_model():
    return BertModel(BertConfig())


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 30522, (8, 128), generator=g)
    attention_mask = torch.ones(8, 128, dtype=torch.int64)
    attention_mask[1, 100:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}
