"""RoBERTa encoder (RobertaModel), tiny random config.

Position ids are derived from input_ids != pad_token_id (1), offset by padding_idx + 1, so
max_position_embeddings = 66 allows sequences up to 64.
Inputs: input_ids (ids drawn from 3.., padded positions set to pad id 1), attention_mask.
Returns BaseModelOutputWithPoolingAndCrossAttentions: last_hidden_state (B, S, 64), pooler_output (B, 64).
"""

import torch
from transformers import RobertaConfig, RobertaModel

VOCAB = 1000


def get_model():
    return RobertaModel(
        RobertaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=66,
            type_vocab_size=1,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, VOCAB, (2, 16), generator=g)
    input_ids[:, 0] = 0  # <s>
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 12:] = 0
    input_ids[1, 12:] = 1  # <pad>
    return {"input_ids": input_ids, "attention_mask": attention_mask}
