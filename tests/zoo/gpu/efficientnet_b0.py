"""EfficientNet-B0 image classifier from torchvision (torchvision.models.efficientnet_b0(), weights=None: random init).

Input: one image batch tensor (16, 3, 224, 224). Returns logits (16, 1000).
"""

import torch
import torchvision


def get_model():
    return torchvision.models.efficientnet_b0()


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 3, 224, 224, generator=g)
