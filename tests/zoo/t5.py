"""T5 encoder-decoder (T5ForConditionalGeneration), tiny random config, use_cache=False.

Inputs: input_ids + attention_mask (encoder, row 1 padded), decoder_input_ids (starting with the
decoder start token 0; 8 long, its own length).
Returns Seq2SeqLMOutput: logits (B, T, 512) and encoder_last_hidden_state (B, S, 64).
"""

import torch
from transformers import T5Config, T5ForConditionalGeneration

VOCAB = 512


def get_model():
    return T5ForConditionalGeneration(
        T5Config(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            use_cache=False,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(2, VOCAB, (2, 16), generator=g)
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 12:] = 0
    input_ids[1, 12:] = 0  # pad
    decoder_input_ids = torch.randint(2, VOCAB, (2, 8), generator=g)
    decoder_input_ids[:, 0] = 0  # decoder_start_token_id
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
    }
