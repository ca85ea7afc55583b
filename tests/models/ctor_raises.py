"""A model whose constructor raises."""

import torch


class Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        raise ValueError("weights file missing")

    def forward(self, x):
        return self.layer(x)
