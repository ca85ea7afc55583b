"""The torch.compile tutorials' plain function of tensors (export it with --entry foo)."""

import torch


def foo(x, y):
    a = torch.sin(x)
    b = torch.cos(y)
    return a + b
