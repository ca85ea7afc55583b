"""The sampler's greedy pick on a CUDA device (aotc_runtime/sampling.py's `greedy_pick`, its
search in parts of the row) against `torch.max` over the row on the CPU: the same first ids and the
same failed rows for the vocabularies of the zoo's shapes, in the precisions packages give logits."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [49152, 50257, 128256, 151936, 1031])
@pytest.mark.parametrize("batch", [1, 8])
def test_the_greedy_pick_on_the_gpu_is_torch_max_on_the_cpu(batch, vocab, dtype):
    from aotc_runtime.sampling import greedy_pick

    g = torch.Generator().manual_seed(vocab + batch)
    logits = torch.randn(batch, vocab, generator=g).to(dtype)
    logits[0, vocab - 3] = float("nan")
    if batch > 1:
        logits[1, :] = float("-inf")
        logits[2, :] = 0.0  # equal logits: id 0
    tokens, failed = greedy_pick(logits.cuda())
    values, ids = logits.max(dim=-1)
    want_failed = ~values.isfinite()
    assert failed.cpu().tolist() == want_failed.tolist()
    assert tokens.cpu().tolist() == ids.masked_fill(want_failed, 0).tolist()
