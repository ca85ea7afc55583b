"""BART encoder-decoder (BartForConditionalGeneration), tiny random config, use_cache=False.

Inputs: input_ids + attention_mask (encoder, row 1 padded), decoder_input_ids (starting with the
decoder start token 2; 8 long, its own length).
Returns Seq2SeqLMOutput: logits (B, T, 512) and encoder_last_hidden_state (B, S, 64).
"""

import torch
from transformers import BartConfig, BartForConditionalGeneration

VOCAB = 512


def get_model():
    return BartForConditionalGeneration(
        BartConfig(
            vocab_size=VOCAB,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=64,
            use_cache=False,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, VOCAB, (2, 16), generator=g)
    input_ids[:, 0] = 0  # <s>
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 12:] = 0
    input_ids[1, 12:] = 1  # <pad>
    decoder_input_ids = torch.randint(3, VOCAB, (2, 8), generator=g)
    decoder_input_ids[:, 0] = 2  # decoder_start_token_id (</s>)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
    }
