"""A model that updates its own buffer in forward (adapted from PyTorch's AOTInductor buffer-mutation
tests): eager returns 1, 2, 3 on three calls."""

import torch


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count += 1
        return x * 0 + self.count
