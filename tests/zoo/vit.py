"""Vision Transformer classifier (ViTForImageClassification, 10 classes), tiny random config:
32x32 images, 8x8 patches (16 patches + CLS).

Inputs: pixel_values (B, 3, 32, 32).
Returns ImageClassifierOutput: logits (B, 10).
"""

import torch
from transformers import ViTConfig, ViTForImageClassification


def get_model():
    return ViTForImageClassification(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            num_labels=10,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g)}
