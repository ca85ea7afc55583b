"""A model that works for long inputs and fails for short ones: it looks up row 40 // length of a
16-row table, out of range below length 3. torch.export cannot see it (no shape guard covers an index)."""

import torch


class ShortFails(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(16, 4)

    def forward(self, x):
        row = torch.full((1,), 40, dtype=torch.int64) // x.shape[1]
        return x.sum(1, keepdim=True) + self.table(row)


def example_inputs():
    return torch.randn(2, 8)
