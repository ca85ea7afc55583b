"""Programmatic dependent launch (PDL) inside aotc's kernels: the wait for the kernel before and
the release of the kernel after (aotc/compiler/programmatic_launch.py launches them so).

Both are one inline-asm statement, `griddepcontrol.wait` then `griddepcontrol.launch_dependents`,
declared pure and returning 0, which each kernel adds to the offsets of everything it reads that
a kernel before it may have written. Pure, because AOTInductor's analysis of a user Triton kernel
(which of its arguments it writes) gives up on an impure inline asm and then assumes every
argument written: the package then copies each weight before each product (measured: a 1B step
3.2 ms against 1.2). The data dependency keeps the statement from being removed and orders
those reads after it; what a kernel reads that nothing writes (a product's weights) needs no
dependency and can be read before it.

Launched plainly, or on a GPU before compute capability 9.0 (where PDL is off and this is not
compiled in), the wait and the release do nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def waits_programmatically(device: torch.device) -> bool:
    """Whether aotc's kernels on `device` carry the wait and the release (compute capability 9.0
    and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def after_predecessor(PDL: tl.constexpr):
    """0, once the kernel before has ended and its writes are visible (PDL), and the kernel after
    may start; plain 0 without PDL. Add it to the offsets of what a predecessor may write."""
    if PDL:
        ready = tl.inline_asm_elementwise(
            "griddepcontrol.wait; griddepcontrol.launch_dependents; mov.u32 $0, 0;",
            "=r",
            [],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )
    else:
        ready = 0
    return ready
