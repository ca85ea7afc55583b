"""aotc's CUDA attention kernel (aotc/kernels/attention.py) against the reference it replaces
(aotc/export/cached_attention.py) and its CPU reference split the same ways
(aotc/kernels/split_attention.py): packed tokens of rows at different positions, a prefill chunk
beside decode tokens, a token that is no row's, grouped heads, a sliding window, soft-capping, a
head size that is not a power of two; the split count the op picks, one span (no second kernel),
and two spans."""

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
    from aotc.export.cached_attention import prefix, reference
    from aotc.kernels.attention import attend  # also registers the kernel's op
    from aotc.kernels.split_attention import split_attention, split_count
    from aotc_runtime.decode_step import pack

    def kernel(*args):  # the op (its own split count), or the kernel split `splits` ways
        if splits is None:
            return torch.ops.aotc.cached_attention_cuda(*args)
        return attend(*args, splits)

    g = torch.Generator(device="cuda").manual_seed(0)
    batch, length = 4, 300
    cache = (batch, length + 1, kv_heads, dim)
    keys = torch.randn(cache, generator=g, device="cuda").to(dtype)
    values = torch.randn(cache, generator=g, device="cuda").to(dtype)
    # row 0 a chunk at the cache's start, row 1 a decode token, row 2 a chunk at the cache's end,
    # row 3 a token that is no row's
    feeds = [(0, 0, [0] * steps), (1, 40, [0]), (2, length - steps, [0] * steps), (3, length, [0])]
    _ids, rows, positions, _picks = (t.cuda() for t in pack(feeds))
    tokens = rows.shape[0]
    # a query strided as a fused projection leaves it: [1, T, Hq, D] seen as [1, Hq, T, D]
    query = torch.randn(1, tokens, heads, dim, generator=g, device="cuda").to(dtype)
    query = query.transpose(1, 2)
    args = (query, keys, values, rows, positions, dim**-0.5, window, softcap)
    got = kernel(*args)
    want = reference(*args)
    tolerance = 2e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)
    assert not got[0, -1].any()  # the token that is no row's: 0
    # the CPU's windows (prefix), on the GPU's inputs
    torch.testing.assert_close(prefix(*args).float(), want.float(), atol=tolerance, rtol=tolerance)
    # and to its CPU reference, split the same ways (aotc/kernels/split_attention.py)
    ways = splits if splits is not None else split_count(batch, heads)
    on_cpu = [t.cpu() if isinstance(t, torch.Tensor) else t for t in args]
    torch.testing.assert_close(
        got.float().cpu(),
        split_attention(*on_cpu, ways).float(),
        atol=tolerance,
        rtol=tolerance,
    )
