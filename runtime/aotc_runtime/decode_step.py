"""A decode step's inputs as buffers on the device, shared by the decode engine (decode_engine.py)
and the CUDA graph that replays the step (cuda_graphs.DecodeGraph)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class DecodeStep:
    """A decode step's inputs as buffers on the device: ids [B, 1], cache lengths [B], input
    lengths [B] (1 for a row decoding, 0 for none). `advance` leaves each row holding what it was
    fed, so no host value crosses to the device per token."""

    def __init__(self, batch: int, device: torch.device):
        self.inputs = [
            torch.zeros(batch, 1, dtype=torch.int64, device=device),
            torch.zeros(batch, dtype=torch.int64, device=device),
            torch.zeros(batch, dtype=torch.int64, device=device),
        ]
        self.ids, self.cache_lengths, self.input_lengths = self.inputs

    def advance(self) -> None:
        self.cache_lengths.add_(self.input_lengths)

    def load(self, inputs: Sequence[torch.Tensor]) -> None:
        for mine, given in zip(self.inputs, inputs):
            mine.copy_(given)
