"""Whisper audio encoder (WhisperModel(...).get_encoder(), a WhisperEncoder), tiny random config:
16 mel bins, 64 input frames (max_source_positions 32 after the stride-2 conv).
The encoder requires exactly 2 * max_source_positions input frames.

Inputs: input_features (B, 16, 64) log-mel features.
Returns BaseModelOutput: last_hidden_state (B, 32, 64).
"""

import torch
from transformers import WhisperConfig, WhisperModel

CONFIG = dict(
    vocab_size=512,
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


def get_model():
    return WhisperModel(WhisperConfig(**CONFIG)).get_encoder()


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_features": torch.randn(2, 16, 64, generator=g)}
