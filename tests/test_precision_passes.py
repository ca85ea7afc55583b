"""The graph passes a bf16/fp16 build applies to a program traced in fp32
(aotc/export/reduced_precision.py, applied by aotc/export/placement.py), on small programs run
eagerly: fast, no package built."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aotc.config import Precision
from aotc.export.placement import place_program

FLOAT32_MIN = torch.finfo(torch.float32).min


class MaskedAttention(torch.nn.Module):
    """Attention with an additive mask made the way transformers makes it in fp32: the dtype's
    minimum where a key is hidden."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, keep):
        bias = torch.zeros(keep.shape, dtype=x.dtype).masked_fill(keep == 0, FLOAT32_MIN)
        q = self.proj(x)[:, None]
        return F.scaled_dot_product_attention(q, q, q, attn_mask=bias[:, None])


def placed_in_bf16(module, *inputs):
    ep = torch.export.export(module.eval(), inputs)
    signature = {
        "inputs": [
            {"name": f"in{i}", "dtype": "x", "shape": list(t.shape)} for i, t in enumerate(inputs)
        ],
        "outputs": [{"name": "out", "dtype": "float32", "shape": []}],
        "dims": {},
    }
    return place_program(ep, "cpu", Precision.BF16, signature)


def test_no_float_constant_of_the_bf16_graph_overflows_bf16():
    """t5-small's bf16 build failed on CUDA: "value cannot be converted to type c10::BFloat16
    without overflow", the fp32 minimum its masks are filled with."""
    torch.manual_seed(0)
    x, keep = torch.randn(2, 4, 8), torch.ones(2, 4, 4, dtype=torch.long)
    placed = placed_in_bf16(MaskedAttention(), x, keep)
    top = torch.finfo(torch.bfloat16).max
    numbers = [
        a
        for node in placed.graph.nodes
        for a in (*node.args, *node.kwargs.values())
        if isinstance(a, float)
    ]
    assert numbers, "the mask's fill value should be in the graph"
    assert all(abs(a) <= top for a in numbers), numbers


def test_the_attention_mask_stays_finite_in_bf16():
    """A left-padded prompt's padding attends to nothing: eager bf16 fills the mask with bf16's
    minimum (finite), where the fp32 minimum cast to bf16 is -inf. A softmax over a row of -inf
    is NaN on the GPU's attention kernels (the CPU's handles it), and the values carry it into
    every later position. Seen on the H100: a Llama's padded prompt generated other tokens than
    transformers in bf16 from its first new token."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class AttentionMasks(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.masks = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if "attention" in func.__name__:
                mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                if isinstance(mask, torch.Tensor):
                    self.masks.append(mask)
            return func(*args, **kwargs)

    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)
    keep = torch.ones(2, 4, 4, dtype=torch.long)
    keep[1, 0, :] = 0  # the second sequence's first query sees no key
    placed = placed_in_bf16(MaskedAttention(), x, keep)
    with torch.no_grad(), AttentionMasks() as seen:
        out = placed.module()(x, keep)
    assert seen.masks and all(m.dtype == torch.bfloat16 for m in seen.masks)
    assert all(bool(torch.isfinite(m).all()) for m in seen.masks)
    assert torch.isfinite(out).all()
