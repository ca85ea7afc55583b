"""DistilBERT-base for question answering (DistilBertForQuestionAnswering(DistilBertConfig()):
distilbert-base-uncased's shape, 66M parameters), random init. The model of the build-time
targets (scripts/build_time.py).

Inputs: input_ids (8, 384), attention_mask (8, 384) with row 1 padded at the end.
Returns QuestionAnsweringModelOutput: start_logits (8, 384), end_logits (8, 384).
"""

import torch
from transformers import DistilBertConfig, DistilBertForQuestionAnswering


def get_model():
    return DistilBertForQuestionAnswering(DistilBertConfig())


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 30522, (8, 384), generator=g)
    attention_mask = torch.ones(8, 384, dtype=torch.int64)
    attention_mask[1, 300:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}
