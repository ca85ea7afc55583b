"""The torch.compile tutorials' graph break: a branch on a tensor's value (`if b.sum() < 0`) splits the model in two."""

import torch


class ToyExample(torch.nn.Module):
    def forward(self, a, b):
        x = a / (torch.abs(a) + 1)
        if b.sum() < 0:
            b = b * -1
        return x * b
