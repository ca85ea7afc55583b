"""ConvNeXt backbone (ConvNextModel), tiny random config: 2 stages (16, 32 channels), 64x64 images.

Inputs: pixel_values (B, 3, 64, 64).
Returns BaseModelOutputWithPoolingAndNoAttention: last_hidden_state (B, 32, 8, 8), pooler_output (B, 32).
"""

import torch
from transformers import ConvNextConfig, ConvNextModel


def get_model():
    return ConvNextModel(
        ConvNextConfig(
            num_channels=3,
            patch_size=4,
            num_stages=2,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            image_size=64,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(2, 3, 64, 64, generator=g)}
