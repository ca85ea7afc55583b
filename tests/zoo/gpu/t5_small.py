"""T5-small (T5ForConditionalGeneration with t5-small's shape: d_model 512, d_ff 2048, 6 layers,
8 heads, vocabulary 32128; 60M parameters), random init, use_cache=False. One of the five
transformers models of the zoo's bf16 CUDA table (docs/models.md); static shapes.

Inputs: input_ids (4, 128) + attention_mask (row 1 padded), decoder_input_ids (4, 32) starting
with the decoder start token 0.
Returns Seq2SeqLMOutput: logits (4, 32, 32128) and encoder_last_hidden_state (4, 128, 512).
"""

import torch
from transformers import T5Config, T5ForConditionalGeneration

VOCAB = 32128


def get_model():
    config = T5Config(
        vocab_size=VOCAB,
        d_model=512,
        d_kv=64,
        d_ff=2048,
        num_layers=6,
        num_heads=8,
        use_cache=False,
    )
    return T5ForConditionalGeneration(config)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(2, VOCAB, (4, 128), generator=g)
    attention_mask = torch.ones(4, 128, dtype=torch.int64)
    attention_mask[1, 100:] = 0
    input_ids[1, 100:] = 0  # pad
    decoder_input_ids = torch.randint(2, VOCAB, (4, 32), generator=g)
    decoder_input_ids[:, 0] = 0  # decoder_start_token_id
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
    }
