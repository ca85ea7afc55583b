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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_masked_row_picks_inside_its_mask_in_a_replayed_graph():
    """The sampler's masked mode captured in a CUDA graph: each replay reads the mask the host
    wrote since (as the decode engine writes it before a step), and an unmasked row picks as in
    the mode without masks."""
    from aotc_runtime.sampling import GREEDY, RowSampler, Sampling

    rows, vocab = 3, 49152
    device = torch.device("cuda")
    sampler = RowSampler(rows, vocab, device)
    sampler.set(0, GREEDY, masked=True)
    sampler.set(1, Sampling(temperature=1.0, seed=5), masked=True)
    sampler.set(2, GREEDY)
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)).to(device)
    mode = sampler.mode
    assert mode.endswith("+masked")
    sampler.warm_up(logits, mode)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampler(logits, None, mode)
    allowed = sampler.allowed_buffer()
    host = logits.cpu()
    for round_ in range(3):
        chosen = {0: [7 + round_, 40000 + round_, 49151], 1: [100 + round_, 200 + round_]}
        mask = torch.zeros(allowed.shape, dtype=torch.int32)
        for row, tokens in chosen.items():
            for token in tokens:
                word, bit = divmod(token, 32)
                mask[row, word] |= (1 << bit) if bit < 31 else -(2**31)
        mask[2] = -1
        allowed.copy_(mask.to(device))
        graph.replay()
        tokens = sampler.tokens.cpu().tolist()
        assert tokens[0] == max(chosen[0], key=lambda t: host[0, t])
        assert tokens[1] in chosen[1]
        assert tokens[2] == int(host[2].argmax())
