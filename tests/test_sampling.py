"""The sampler (runtime/aotc_runtime/sampling.py): each row of a batch picks by its own settings,
from random numbers that are a hash of the row's seed and its count of tokens. Checked against a
plain-Python splitmix64, against softmax's probabilities, and against the filters' definitions
(transformers' order: temperature, top-k, top-p)."""

from __future__ import annotations

import pytest
import torch

from aotc_runtime.sampling import (
    FILTERED,
    GREEDY,
    GREEDY_ONLY,
    SAMPLED,
    RowSampler,
    Sampling,
    greedy_pick,
    largest,
    parts_of,
    uniforms,
)

CPU = torch.device("cpu")


def splitmix64(seed: int, counter: int) -> float:
    """The reference: the hash on Python integers, mod 2**64."""
    mod = 2**64
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) % mod
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % mod
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % mod
    z ^= z >> 31
    return (z >> 40) / 2**24


def test_the_random_numbers_are_splitmix64_of_seed_and_count():
    seeds = [0, 1, 7, 2**63 - 1, 2**63, 2**64 - 1, 12345678901234567]
    as_int64 = torch.tensor([s - 2**64 if s >= 2**63 else s for s in seeds])
    for counter in (0, 1, 5, 1000, 2**40):
        got = uniforms(as_int64, torch.full((len(seeds),), counter)).tolist()
        assert got == [splitmix64(s, counter) for s in seeds], counter
    assert splitmix64(0, 0) == pytest.approx(0.8833108, abs=1e-7)  # a known value, by hand


def frequencies(sampler: RowSampler, logits: torch.Tensor, draws: int) -> torch.Tensor:
    counts = torch.zeros(logits.shape)
    for _ in range(draws):
        tokens = sampler(logits)
        counts[torch.arange(len(tokens)), tokens] += 1
    return counts / draws


LOGITS = torch.tensor([0.0, 1.0, 2.0, 0.5, -1.0, 1.5])


def test_sampled_rows_follow_softmax_of_logits_over_temperature():
    """20,000 draws a row (fixed seeds: the test gives the same counts every run)."""
    sampler = RowSampler(2, 6, CPU)
    sampler.set(0, Sampling(temperature=1.0, seed=3))
    sampler.set(1, Sampling(temperature=0.5, seed=4))
    assert sampler.mode == SAMPLED
    got = frequencies(sampler, torch.stack([LOGITS, LOGITS]), 20_000)
    assert torch.allclose(got[0], LOGITS.softmax(-1), atol=0.01)
    assert torch.allclose(got[1], (LOGITS / 0.5).softmax(-1), atol=0.01)


def test_top_k_then_top_p_keep_the_tokens_their_definitions_keep():
    """Row 0: top-k 3 keeps tokens 2, 5, 1 in softmax's proportions among them. Row 1: top-p 0.6
    keeps 2 (0.42 of the mass) and then 5 (the mass before it, 0.42, is below 0.6), not 1 (0.67
    before it). Row 2 greedy, row 3 top-k 1 (greedy too)."""
    sampler = RowSampler(4, 6, CPU)
    sampler.set(0, Sampling(temperature=1.0, top_k=3, seed=3))
    sampler.set(1, Sampling(temperature=1.0, top_p=0.6, seed=5))
    sampler.set(3, Sampling(temperature=1.0, top_k=1, seed=5))
    assert sampler.mode == FILTERED
    got = frequencies(sampler, LOGITS.repeat(4, 1), 10_000)
    top3 = torch.full((6,), float("-inf"))
    top3[[1, 2, 5]] = LOGITS[[1, 2, 5]]
    assert torch.allclose(got[0], top3.softmax(-1), atol=0.015)
    top2 = torch.full((6,), float("-inf"))
    top2[[2, 5]] = LOGITS[[2, 5]]
    assert torch.allclose(got[1], top2.softmax(-1), atol=0.015)
    assert got[2].tolist() == got[3].tolist() == [0, 0, 1, 0, 0, 0]


def test_a_rows_tokens_depend_on_its_seed_and_count_only():
    """The same seeded row beside different neighbours, in a different slot, with rows that draw
    and rows that do not: the same tokens. A row's count restarts when it is set again."""
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(0))
    hot = Sampling(temperature=0.9, top_k=20, top_p=0.9, seed=11)

    def tokens(slot: int, neighbours: Sampling, rows: int) -> list:
        sampler = RowSampler(rows, 50, CPU)
        for row in range(rows):
            sampler.set(row, neighbours)
        sampler.set(slot, hot)
        out = []
        for step in range(16):
            batch = (
                logits[step].repeat(rows, 1)
                + torch.randn(rows, 50) * (torch.arange(rows) != slot)[:, None]
            )
            out.append(sampler(batch)[slot].item())
        return out

    alone = tokens(0, GREEDY, 1)
    assert tokens(2, Sampling(temperature=1.3, seed=2), 4) == alone
    assert tokens(1, GREEDY, 3) == alone
    assert len(set(alone)) > 3, "the row was not sampled"


def test_a_row_still_fed_its_prompt_does_not_count_a_draw():
    sampler = RowSampler(2, 6, CPU)
    hot = Sampling(temperature=1.0, seed=9)
    sampler.set(0, hot)
    sampler.set(1, hot)
    logits = LOGITS.repeat(2, 1)
    sampler(logits, drawing=torch.tensor([True, False]))  # row 1 made no token this step
    first_of_row_1 = sampler(logits, drawing=torch.tensor([True, True]))[1].item()
    fresh = RowSampler(1, 6, CPU)
    fresh.set(0, hot)
    assert fresh(LOGITS[None])[0].item() == first_of_row_1
    assert sampler.drawn.tolist() == [2, 1]


def test_greedy_rows_take_the_argmax_and_a_greedy_batch_does_no_sampling_work():
    sampler = RowSampler(3, 6, CPU)
    assert sampler.mode == GREEDY_ONLY
    logits = torch.randn(3, 6)
    assert sampler(logits).tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    "vocab, parts",
    [(49152, 48), (128256, 96), (151936, 128), (50257, 29), (32000, 25), (1031, 1), (2000, 1)],
    ids=["smollm2", "llama3", "qwen3", "gpt2", "llama2", "prime", "no-divisor"],
)
def test_the_largest_logit_in_parts_is_torch_max_over_the_row(vocab, parts):
    """Equal parts of the row that divide it (a view), each at least MIN_PART logits: the known
    vocabularies' counts, and the same values and first ids as one reduction, ties between parts
    going to the first (GPT-2's 50,257 is 29 x 1,733)."""
    assert parts_of(vocab) == parts
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(4, vocab, generator=g)
    logits[1, :] = 0.0  # every logit equal: id 0
    span = vocab // parts
    top = logits[2].max() + 1
    logits[2, vocab - 1] = top  # the last part's last id, then an equal one in an earlier part
    logits[2, span + 3 if parts > 1 else 3] = top
    logits[3, 5] = float("-inf")
    for dtype in (torch.float32, torch.bfloat16):
        got_values, got_ids = largest(logits.to(dtype), parts)  # as on CUDA
        want_values, want_ids = logits.to(dtype).max(dim=-1)
        assert got_ids.tolist() == want_ids.tolist()
        assert torch.equal(got_values, want_values)
    assert largest(logits, parts)[1].tolist()[1:3] == [0, span + 3 if parts > 1 else 3]


@pytest.mark.parametrize("vocab", [49152, 50257, 1031])
def test_the_greedy_pick_marks_non_finite_rows_and_gives_them_token_0(vocab):
    """One search for the token and the check: a NaN anywhere (in any part), a +inf, or nothing
    but -inf fails the row; a -inf among finite logits does not."""
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(1))
    logits[0, vocab - 2] = float("nan")
    logits[1, 7] = float("inf")
    logits[2, :] = float("-inf")
    logits[3, 11] = float("-inf")
    tokens, failed = greedy_pick(logits, parts_of(vocab))  # in parts, as on CUDA
    assert failed.tolist() == [True, True, True, False, False]
    assert greedy_pick(logits, 1)[0].tolist() == tokens.tolist()
    assert tokens.tolist()[:3] == [0, 0, 0]
    assert tokens.tolist()[3:] == logits[3:].argmax(-1).tolist()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize(
    "settings",
    [
        Sampling(),
        Sampling(temperature=0.7, seed=3),
        Sampling(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, seed=3),
        Sampling(temperature=0.7, seed=3, presence_penalty=0.5, repetition_penalty=1.2),
    ],
    ids=["greedy", "sampled", "filtered", "penalized"],
)
def test_a_row_with_non_finite_logits_gets_an_id_inside_the_vocabulary_and_is_marked(bad, settings):
    """Inverse-CDF over a NaN running sum searches to the end: the vocabulary's size, which the
    model's embedding cannot take. The row gets 0 and is marked failed; its neighbour is not."""
    from aotc_runtime.sampling import RowSampler

    vocab = 64
    sampler = RowSampler(2, vocab, torch.device("cpu"))
    for row in (0, 1):
        sampler.set(row, settings, prompt=[1, 2], logprobs=3)
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(0))
    clean = sampler.choose(logits, sampler.mode)[0][1].item()
    logits[0, 7] = bad
    tokens = sampler(logits).tolist()
    assert tokens[0] == 0 and 0 <= tokens[1] < vocab and tokens[1] == clean
    assert sampler.failed.tolist() == [True, False]
    everything_masked = torch.full((2, vocab), float("-inf"))
    sampler(everything_masked)
    assert sampler.failed.tolist() == [True, True] and sampler.tokens.tolist() == [0, 0]
