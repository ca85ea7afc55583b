"""A package's initial state (STATE_FILE): what the runtime carries between calls, a KV cache say."""

from __future__ import annotations

from pathlib import Path

from aotc.export.call_structure import initial_state
from aotc_runtime import STATE_FILE


def write_state(ep, signature: dict, folder: Path, precision=None) -> None:
    """The initial state as plain tensors (loaded with weights_only).

    A tensor of one value throughout (a KV cache starts all zeros) is saved as that value expanded
    to its shape: one element on disk, read back by both runtimes as a stride-0 view that their
    first clone makes whole. GPT-2 124M's cache for 1,024 positions would otherwise be 75 MB of
    zeros in a 500 MB package. A bf16/fp16 package keeps its floating state in that dtype
    (aotc/export/placement.py: state_in_precision)."""
    import torch

    from aotc.config import Precision
    from aotc.export.placement import state_in_precision

    state = state_in_precision(initial_state(ep, signature, "cpu"), precision or Precision.FP32)
    torch.save([compact(t) for t in state], folder / STATE_FILE)


def compact(tensor):
    """`tensor`, or its one value expanded to its shape when it holds one value throughout."""
    flat = tensor.reshape(-1)
    if flat.numel() < 2 or not bool((flat == flat[0]).all()):
        return tensor
    return flat[:1].clone().expand(tensor.shape)
