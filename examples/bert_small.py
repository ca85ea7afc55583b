"""BERT-small (Turc et al., 2019: 4 layers, hidden 512, 8 heads, intermediate 2048; 29M parameters
with bert-base's vocabulary), random init, for CPU benchmarks: no download.

Inputs: input_ids (8, 128), attention_mask (8, 128). Returns last_hidden_state and pooler_output.
"""

import torch
from transformers import BertConfig, BertModel


def get_model():
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048
    )
    return BertModel(config)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 30522, (8, 128), generator=g)
    attention_mask = torch.ones(8, 128, dtype=torch.int64)
    return {"input_ids": input_ids, "attention_mask": attention_mask}
