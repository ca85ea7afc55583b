"""Whisper speech-to-text (WhisperForConditionalGeneration), tiny random config, use_cache=False:
16 mel bins, 64 input frames, decoder vocabulary 512.

Inputs: input_features (B, 16, 64), decoder_input_ids (B, 8) starting with the decoder start token.
Returns Seq2SeqLMOutput: logits (B, 8, 512), encoder_last_hidden_state (B, 32, 64).
"""

import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

VOCAB = 512


def get_model():
    return WhisperForConditionalGeneration(
        WhisperConfig(
            vocab_size=VOCAB,
            num_mel_bins=16,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_source_positions=32,
            max_target_positions=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            use_cache=False,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_features = torch.randn(2, 16, 64, generator=g)
    decoder_input_ids = torch.randint(3, VOCAB, (2, 8), generator=g)
    decoder_input_ids[:, 0] = 1  # decoder_start_token_id
    return {"input_features": input_features, "decoder_input_ids": decoder_input_ids}
