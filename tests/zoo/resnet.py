"""ResNet classifier from transformers (ResNetForImageClassification, 10 classes), tiny random config:
basic blocks, 2 stages (16, 32 channels), 64x64 images.

Inputs: pixel_values (B, 3, 64, 64).
Returns ImageClassifierOutputWithNoAttention: logits (B, 10).
"""

import torch
from transformers import ResNetConfig, ResNetForImageClassification


def get_model():
    return ResNetForImageClassification(
        ResNetConfig(
            num_channels=3,
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            layer_type="basic",
            num_labels=10,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(2, 3, 64, 64, generator=g)}
