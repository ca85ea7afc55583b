"""Two data-dependent branches: torch.export stops at the first, draft_export lists both."""

import torch


class TwoBranches(torch.nn.Module):
    def forward(self, x, counts):
        y = x.sum(1)
        if y.sum() > 0:
            y = y * 2
        largest = counts.max().item()
        if largest > 2:
            y = y + 1
        return y


def example_inputs():
    return torch.randn(4, 8), torch.tensor([1, 2, 3])
