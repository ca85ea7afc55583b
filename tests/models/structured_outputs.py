"""A model that returns its own output class (a dataclass registered as a pytree node, as
transformers registers ModelOutput), with a nested tuple and a None entry, called with keyword inputs."""

from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree


@dataclass
class Result:
    logits: torch.Tensor
    hidden: tuple
    aux: torch.Tensor | None = None


pytree.register_dataclass(Result, serialized_type_name="structured_outputs.Result")


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, ids, mask=None, scale: float = 1.0):
        hidden = self.embed(ids) * mask.unsqueeze(-1) * scale
        return Result(logits=self.head(hidden), hidden=(hidden, hidden.sum(1)))


def get_model():
    return Tagger()


def example_inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (4, 6), generator=g)
    return {"ids": ids, "mask": torch.ones(4, 6), "scale": 2.0}
