"""GPT-2's device pattern on a small model: positions made on the ids' device, embeddings, and
`.to(device)` / `.to(device, dtype)` calls, which trace to device arguments in the graph."""

import torch


class Positions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(50, 8), torch.nn.Embedding(16, 8)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        hidden = (self.wte(ids) + self.wpe(positions)).to(ids.device)
        mask = torch.ones(ids.shape, device=ids.device)
        return hidden.to(ids.device, torch.float64).float() * mask[..., None]


def example_inputs():
    return (torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(0)),)
