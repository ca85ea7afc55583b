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


def lookup_program(flat: list[torch.Tensor]) -> list[torch.Tensor]:
    """A stand-in for a package's step (decode_step.py's contract, its state one table): the logits
    of each picked token are its id's row of the table, shifted by its position. Pure torch ops,
    so a CUDA graph captures it, and a token padded in (no row's) changes nothing picked."""
    ids, _rows, positions, picks, table = flat
    return [table[ids[picks]] + positions[picks, None].to(table.dtype) * 0.01]


class _Uncapturable:
    """A RowSampler whose call refuses to be captured, as an op no graph can hold would."""

    def __init__(self, sampler):
        self._sampler = sampler

    def __getattr__(self, name):
        return getattr(self._sampler, name)

    def __call__(self, *args):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("this sampler cannot be captured")
        return self._sampler(*args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("capturable", [True, False], ids=["replayed", "eager-fallback"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_join_steps_sampler_replayed_as_a_graph_does_what_the_eager_sampler_does(
    dtype, capturable, capsys
):
    """cuda_graphs.DecodeGraph.join: each bucket's graph copies its logits and drawing flags to
    the buffers the join sampler's graph (one per mode) reads. Over join steps of random sizes
    (several buckets), rows drawing or still fed their prompts, greedy, sampled, filtered, penalized
    and logprob rows, and settings changed midway (a new mode captured then), every output and
    every state the sampler keeps (tokens, failed rows, log-probabilities, draw counts, penalty
    counts) equals an eager RowSampler's on the same logits; where the sampler cannot be
    captured, the join step samples without a graph, after one warning."""
    from contextlib import nullcontext

    from aotc_runtime.cuda_graphs import DecodeGraph
    from aotc_runtime.decode_step import DecodeStep
    from aotc_runtime.sampling import GREEDY, RowSampler, Sampling

    rows, vocab, max_len, words = 4, 4096, 64, 300
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(11)
    table = (torch.randn(words, vocab, generator=g) * 3).to(device, dtype)
    sampler = RowSampler(rows, vocab, device)
    graph = DecodeGraph(
        lookup_program,
        device,
        DecodeStep(rows, max_len, device),
        sampler if capturable else _Uncapturable(sampler),
        [table],
        nullcontext,
    )
    eager = RowSampler(rows, vocab, device)
    prompt = [3, 9, 27, 81]
    first = [
        GREEDY,
        Sampling(temperature=0.8, seed=5),
        Sampling(temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.5, seed=6),
        Sampling(temperature=1.2, presence_penalty=0.5, frequency_penalty=0.3, seed=7),
    ]
    for one in (sampler, eager):
        for row, settings in enumerate(first):
            one.set(row, settings, prompt, logprobs=3 if row == 2 else None)
    graph.prepare_joins(32)
    rng = torch.Generator().manual_seed(3)
    modes = set()
    for step in range(12):
        if step == 6:  # row 2 taken by a sequence that asks for no log-probabilities: a new mode
            for one in (sampler, eager):
                one.set(2, first[2], prompt)
        # each row's tokens this step (0: none; some steps long enough for the larger buckets)
        fed = torch.randint(0, 12 if step % 3 else 40, (rows,), generator=rng).tolist()
        fed[step % rows] = max(fed[step % rows], 1)
        ids, feed_rows, positions, picks = [], [], [], [0] * rows
        for row, count in enumerate(fed):
            ids += torch.randint(0, words, (count,), generator=rng).tolist()
            feed_rows += [row] * count
            positions += list(range(count))
            if count:
                picks[row] = len(ids) - 1
        drawing = [int(c > 0 and bool(torch.rand(1, generator=rng) < 0.7)) for c in fed]
        mode = sampler.mode
        modes.add(mode)
        tokens = graph.join(ids, feed_rows, positions, picks, drawing, mode)
        assert tokens is not None, "a join step inside the buckets must run through them"
        inputs = [torch.tensor(x, device=device) for x in (ids, feed_rows, positions, picks)]
        logits = lookup_program([*inputs, table])[0]
        expected = eager(logits, torch.tensor(drawing, device=device))
        assert tokens.tolist() == expected.tolist(), (step, mode)
        for name in ("failed", "drawn", "counts", "top_ids"):
            assert torch.equal(getattr(sampler, name), getattr(eager, name)), (step, mode, name)
        for name in ("logprob", "top_logprobs"):  # the same kernels: equal but for a rounding
            torch.testing.assert_close(
                getattr(sampler, name), getattr(eager, name), rtol=0, atol=1e-6
            )
    assert len(modes) == 2
    if capturable:
        assert graph.captured_join_modes == modes | {"greedy"}
    else:
        assert graph.captured_join_modes == set()
        warnings = capsys.readouterr().err.count("of the join steps' sampler")
        assert warnings == 3, "one warning per mode (greedy at prepare_joins, then the two)"
