"""ConvNeXt-Tiny image classifier from timm (timm.create_model("convnext_tiny", pretrained=False)), random init.

Input: one image batch tensor (16, 3, 224, 224). Returns logits (16, 1000).
"""

import timm
import torch


def get_model():
    return timm.create_model("convnext_tiny", pretrained=False)


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 3, 224, 224, generator=g)
