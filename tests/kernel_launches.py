"""The launches a kernel launcher of aotc's makes, recorded instead of run: each Triton kernel
with its arguments by name (tests/test_kernel_frontend.py, tests/test_programmatic_launch.py)."""

from __future__ import annotations


def recorded(launcher, *args, **kwargs) -> list[tuple]:
    """[(kernel, {argument: value})] of each kernel `launcher(*args, launch=..., **kwargs)`
    launches, in order."""
    launched = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def call(*positional, **named):
                values = dict(zip(self.kernel.arg_names, positional))
                values.update({k: v for k, v in named.items() if k in self.kernel.arg_names})
                launched.append((self.kernel, values))

            return call

    launcher(*args, launch=Recorder, **kwargs)
    return launched


def attention_case(dtype, device: str = "cpu") -> tuple:
    """attention.attend's arguments for 64 packed tokens of one row over a 128-position cache,
    4 query heads on 2 key/value heads, 4 splits: both the tiled and the split kernels launch."""
    import torch

    query = torch.randn(1, 4, 64, 64, dtype=dtype, device=device)
    keys = torch.randn(1, 129, 2, 64, dtype=dtype, device=device)
    rows = torch.zeros(64, dtype=torch.long, device=device)
    positions = torch.arange(64, device=device)
    return query, keys, keys.clone(), rows, positions, 0.125, 0, 0.0, 4
