"""Two nn.Module classes and no get_model(): the entry is ambiguous."""

import torch


class First(torch.nn.Module):
    def forward(self, x):
        return x + 1


class Second(torch.nn.Module):
    def forward(self, x):
        return x * 2
