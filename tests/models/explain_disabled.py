"""The torch.compile tutorials' torch.compiler.disable: a helper the compiler is told to skip (run
it with --entry fn)."""

import torch


@torch.compiler.disable
def helper(x):
    return torch.sin(x) * 2


def fn(x):
    y = torch.cos(x)
    y = helper(y)
    return y + 1
