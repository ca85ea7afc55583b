"""wav2vec 2.0 speech encoder (Wav2Vec2Model), tiny random config: 2 conv feature layers
(kernel 10 stride 5, kernel 3 stride 2), hidden 64, 2 transformer layers. 1600 samples -> 159 frames.
No attention_mask (the default group-norm feature extractor is used without one).

Inputs: input_values (B, 1600) raw waveform.
Returns Wav2Vec2BaseModelOutput: last_hidden_state (B, 159, 64), extract_features (B, 159, 32).
"""

import torch
from transformers import Wav2Vec2Config, Wav2Vec2Model


def get_model():
    return Wav2Vec2Model(
        Wav2Vec2Config(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            conv_dim=(32, 32),
            conv_kernel=(10, 3),
            conv_stride=(5, 2),
            num_feat_extract_layers=2,
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            vocab_size=32,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_values": torch.randn(2, 1600, generator=g)}
