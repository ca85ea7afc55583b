"""Two inputs: float32 features and int64 indices into an nn.Embedding; two outputs."""

import torch
import torch.nn as nn


class FeaturesAndIds(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, features, ids):
        mixed = self.proj(features) + self.embed(ids).mean(1)
        return mixed.relu(), mixed.sum(-1)


def get_model():
    torch.manual_seed(0)
    return FeaturesAndIds()


def example_inputs():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=generator), torch.randint(
        0, 100, (8, 5), generator=generator
    )
