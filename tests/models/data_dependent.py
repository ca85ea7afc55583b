"""Data-dependent control flow: torch.export cannot capture the branch."""

import torch


class Flip(torch.nn.Module):
    def forward(self, x):
        if x.sum() < 0:
            return x * -1
        return x
