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
