"""aotc's CUDA attention kernel (aotc/kernels/attention.py) against the reference it replaces
(aotc/export/cached_attention.py) and its CPU reference split the same ways
(aotc/kernels/split_attention.py): rows at different positions, prefill windows and decode steps,
grouped heads, a sliding window, soft-capping, a head size that is not a power of two; the split
count the op picks, one span (no second kernel), and two spans."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("splits", [None, 1, 2], ids=["op", "one-span", "two-spans"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "heads, kv_heads, dim, steps, window, softcap",
    [(4, 4, 64, 1, 0, 0.0), (32, 8, 64, 1, 0, 0.0), (16, 8, 128, 7, 0, 0.0), (8, 2, 80, 5, 6, 0.0),
     (4, 2, 16, 3, 0, 50.0), (4, 1, 64, 130, 0, 0.0)],
)  # fmt: skip
def test_the_kernel_attends_as_the_reference(
    heads, kv_heads, dim, steps, window, softcap, dtype, splits
):
    from aotc.export.cached_attention import reference
    from aotc.kernels.attention import attend  # also registers the kernel's op
    from aotc.kernels.split_attention import split_attention, split_count

    def kernel(*args):  # the op (its own split count), or the kernel split `splits` ways
        if splits is None:
            return torch.ops.aotc.cached_attention_cuda(*args)
        return attend(*args, *([None] * (8 - len(args))), splits)

    g = torch.Generator(device="cuda").manual_seed(0)
    batch, length = 3, 300
    cache = (batch, length + 1, kv_heads, dim)
    keys = torch.randn(cache, generator=g, device="cuda").to(dtype)
    values = torch.randn(cache, generator=g, device="cuda").to(dtype)
    # a query strided as a fused projection leaves it: [B, S, Hq, D] seen as [B, Hq, S, D]
    query = torch.randn(batch, steps, heads, dim, generator=g, device="cuda").to(dtype)
    query = query.transpose(1, 2)
    starts = torch.tensor([0, 40, length - steps], device="cuda")
    scale = dim**-0.5
    got = kernel(query, keys, values, starts, scale, window, softcap)
    want = reference(query, keys, values, starts, scale, window, softcap)
    tolerance = 2e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)
    # with each row's padding marked (all of the window, part of it, none): 0 there, the same
    # elsewhere
    firsts = torch.tensor([steps, steps // 2, 0], device="cuda")
    padded = kernel(query, keys, values, starts, scale, window, softcap, firsts)
    torch.testing.assert_close(
        padded.float(),
        reference(query, keys, values, starts, scale, window, softcap, firsts).float(),
        atol=tolerance,
        rtol=tolerance,
    )
    assert not padded[0].any() and not padded[1, : steps // 2].any()
    # and to its CPU reference, split the same ways (aotc/kernels/split_attention.py)
    ways = splits if splits is not None else split_count(query.shape[0], query.shape[1])
    on_cpu = [t.cpu() if isinstance(t, torch.Tensor) else t for t in
              (query, keys, values, starts, scale, window, softcap, firsts)]  # fmt: skip
    torch.testing.assert_close(
        padded.float().cpu(),
        split_attention(*on_cpu, ways).float(),
        atol=tolerance,
        rtol=tolerance,
    )
