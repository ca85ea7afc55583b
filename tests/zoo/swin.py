"""Swin Transformer backbone (SwinModel), tiny random config: 32x32 images, 2x2 patches, window 4,
2 stages (embed 32 -> 64).

Inputs: pixel_values (B, 3, 32, 32).
Returns SwinModelOutput: last_hidden_state (B, 64, 64), pooler_output (B, 64),
reshaped_hidden_states is not returned (output_hidden_states off).
"""

import torch
from transformers import SwinConfig, SwinModel


def get_model():
    return SwinModel(
        SwinConfig(
            image_size=32,
            patch_size=2,
            num_channels=3,
            embed_dim=32,
            depths=[1, 1],
            num_heads=[2, 4],
            window_size=4,
            mlp_ratio=2.0,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g)}
