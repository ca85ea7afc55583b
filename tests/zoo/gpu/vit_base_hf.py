"""ViT-base/16 for image classification from transformers (ViTForImageClassification(ViTConfig()):
google/vit-base-patch16-224's shape, 86M parameters), random init. One of the five
transformers models of the zoo's bf16 CUDA table (docs/models.md), with a dynamic batch.

Inputs: pixel_values (8, 3, 224, 224).
Returns ImageClassifierOutput: logits (8, 2).
"""

import torch
from transformers import ViTConfig, ViTForImageClassification


def get_model():
    return ViTForImageClassification(ViTConfig())


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(8, 3, 224, 224, generator=g)}
