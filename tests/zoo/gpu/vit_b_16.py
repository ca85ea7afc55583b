"""ViT-B/16 image classifier from torchvision (torchvision.models.vit_b_16(), weights=None: random init).

Input: one image batch tensor (8, 3, 224, 224). Returns logits (8, 1000).
"""

import torch
import torchvision


def get_model():
    return torchvision.models.vit_b_16()


def example_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, 224, 224, generator=g)
