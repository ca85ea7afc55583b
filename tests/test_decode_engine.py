"""The decode engine (runtime/aotc_runtime/decode_engine.py): sequences join a running batch and
leave it at step boundaries, and each gets the tokens it gets alone (the runtime's own `generate`,
which tests/test_generate.py holds to transformers' `generate`). The conftest's generation
packages: batch 2, a 32-token cache, built once per session. These hold the engine to the real
compiled program, one test per behaviour; tests/test_decode_engine_fake.py tests the same
semantics, and more, against tests/fake_generation.py with nothing compiled."""

from __future__ import annotations

import pytest
import torch

import aotc_runtime
from aotc_runtime.decode_engine import DecodeEngine
from aotc_runtime.errors import GenerationInputError
from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.generation_request import GenerationRequest
from aotc_runtime.sampling import GREEDY, Sampling

pytestmark = pytest.mark.slow


def alone(package, prompt: list, new_tokens: int, sampling: Sampling = GREEDY) -> list:
    out = package.generate(
        torch.tensor([prompt]),
        max_new_tokens=new_tokens,
        eos_token_ids=[],
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        seed=sampling.seed,
    )
    return out[0, len(prompt) :].tolist()


def request(prompt: list, new_tokens: int, sampling: Sampling = GREEDY) -> GenerationRequest:
    """No end-of-sequence id: a sequence makes all its tokens (a random model's are any)."""
    return GenerationRequest(tuple(prompt), new_tokens, sampling, eos_token_ids=())


def run(engine: DecodeEngine, plan: dict) -> dict:
    """plan: step at which each sequence joins -> (key, prompt, new tokens[, sampling]). Steps
    until every sequence has all its tokens; returns key -> tokens."""
    made: dict = {}
    wanted = {key: new for key, _prompt, new, *_sampling in plan.values()}
    step = 0
    while step == 0 or engine.active or any(at >= step for at in plan):
        for key, prompt, new, *sampling in [plan[at] for at in plan if at == step]:
            assert engine.has_free_row, key
            engine.join(key, request(prompt, new, *sampling))
            made[key] = []
        for new_token in engine.step():
            key = new_token.key
            made[key].append(new_token.token)
            # the engine ends a sequence at its last token, and frees its row
            assert new_token.finish == (
                FinishReason.LENGTH if len(made[key]) == wanted[key] else None
            ), key
        step += 1
        assert step < 100
    return made


@pytest.mark.parametrize(
    "family, overlap",
    [("gpt2", False), ("llama", False), ("gpt2", True)],
    ids=["gpt2", "llama", "gpt2-step-ahead"],
)
def test_sequences_joining_a_running_batch_get_their_own_tokens(
    generation_packages, family, overlap
):
    """With overlap (CUDA's default; here on the CPU, where the step queued ahead runs at once) a
    joining sequence waits for the step already queued, and a row that left drops its token."""
    package = aotc_runtime.load(generation_packages[family][0])
    assert package.manifest.generation.sliding_window == 0
    plan = {
        0: ("a", [5, 17, 42, 9, 100], 14),  # alone for 3 steps, then beside b, then beside c
        3: ("b", [7, 8, 300], 6),  # joins a running batch: one call feeds a's next token too
        10: ("c", [11, 12, 13, 14], 5),  # into the row b left, with a still running
    }
    batch = DecodeEngine(package, overlap=overlap)
    made = run(batch, plan)
    for key, prompt, new in plan.values():
        assert made[key] == alone(package, prompt, new), key
    # the batch gave the package back: generate runs again
    assert alone(package, [5, 6], 2) == alone(package, [5, 6], 2)


@pytest.mark.parametrize("overlap", [False, True], ids=["", "step-ahead"])
def test_greedy_and_sampled_sequences_share_a_running_batch(generation_packages, overlap):
    """Each row picks by its own settings, its random numbers its own (a hash of its seed and its
    count of tokens): a seeded sequence's tokens are its lone `generate`'s whatever its
    neighbours, greedy or sampled, join or leave."""
    package = aotc_runtime.load(generation_packages["gpt2"][0])
    hot = Sampling(temperature=0.9, top_k=50, top_p=0.95, seed=7)
    plan = {
        0: ("a", [5, 17, 42, 9, 100], 14, hot),
        2: ("b", [7, 8, 300], 6),  # greedy beside the sampled a
        9: ("c", [11, 12, 13, 14], 5, Sampling(temperature=1.3, seed=3)),  # into b's row
    }
    made = run(DecodeEngine(package, overlap=overlap), plan)
    for key, prompt, new, *sampling in plan.values():
        assert made[key] == alone(package, prompt, new, *sampling), key
    assert made["a"] != alone(package, [5, 17, 42, 9, 100], 14), "sampling was not used"


def test_a_sequence_joins_whenever_a_row_is_free_and_its_cache_holds_it(generation_packages):
    """Rows have timelines of their own: a row that ran long does not shorten another's."""
    package = aotc_runtime.load(generation_packages["gpt2"][0])
    engine = DecodeEngine(package)
    engine.join("a", request([5, 6, 7], 29))
    for _ in range(10):
        engine.step()
    # a holds 13 of its row's 32 positions; the other row holds a whole 30 + 2 (the request's
    # own check against the package: a row's room is never the engine's to judge)
    assert engine.has_free_row
    request([1] * 30, 2).check(package.generation)
    with pytest.raises(GenerationInputError, match="need 33 positions"):
        request([1] * 31, 2).check(package.generation)
    engine.join("b", request([1, 2], 2))
    assert not engine.has_free_row  # batch of 2
    engine.release()


def test_a_sequence_ends_at_its_end_of_sequence_id_and_frees_its_row(generation_packages):
    """The engine decides a row's end (GenerationRequest.finish_reason): its first token that is
    an end-of-sequence id ends it with "stop", and its row takes the next sequence."""
    package = aotc_runtime.load(generation_packages["gpt2"][0])
    tokens = alone(package, [5, 17, 42], 8)
    eos = tokens[3]
    engine = DecodeEngine(package)
    engine.join("a", GenerationRequest((5, 17, 42), 8, GREEDY, eos_token_ids=(eos,)))
    made = []
    while engine.active:
        made += engine.step()
    ends = tokens.index(eos) + 1  # the first time the model says it
    assert [m.token for m in made] == tokens[:ends]
    assert [m.finish for m in made] == [None] * (ends - 1) + [FinishReason.STOP]
    assert engine.has_free_row and engine.active == 0


def test_a_long_prompt_joins_in_chunks_beside_a_running_sequence(generation_packages):
    """Chunks of 4 tokens: b's 14-token prompt takes 4 steps, each of which makes a's next token,
    and both get their lone tokens."""
    package = aotc_runtime.load(generation_packages["llama"][0])
    plan = {
        0: ("a", [5, 17, 42, 9, 100], 12),
        2: ("b", [7, 8, 300, 4, 9, 11, 250, 31, 77, 2, 19, 60, 8, 401], 6),
    }
    batch = DecodeEngine(package, prefill_chunk=4)
    made = run(batch, plan)
    for key, prompt, new in plan.values():
        assert made[key] == alone(package, prompt, new), key


def test_a_model_with_a_sliding_window_takes_sequences_into_a_running_batch(generation_packages):
    """Each row's positions are its own, so a window (gemma2's is shorter than the cache) means
    the same beside others as alone."""
    package = aotc_runtime.load(generation_packages["gemma2"][0])
    assert package.manifest.generation.sliding_window > 0
    plan = {
        0: ("a", [5, 17, 42, 9, 100], 14),
        4: ("b", [7, 8, 300], 6),
    }
    made = run(DecodeEngine(package), plan)
    for key, prompt, new in plan.values():
        assert made[key] == alone(package, prompt, new), key


def test_stop_strings_without_a_tokenizer_are_refused_and_hold_nothing(generation_packages):
    """Stop strings are text: an engine given no tokenizer refuses them in one line, before it
    takes the package (a generation runs on it at once after)."""
    from aotc_runtime.errors import GenerationInputError

    package = aotc_runtime.load(generation_packages["gpt2"][0])
    engine = DecodeEngine(package)
    stopped = GenerationRequest((5, 6), 4, GREEDY, eos_token_ids=(), stop=("w9",))
    with pytest.raises(
        GenerationInputError, match="^stop strings are text: they need the package's tokenizer"
    ):
        engine.join("a", stopped)
    assert engine.active == 0
    assert alone(package, [5, 6], 2) == alone(package, [5, 6], 2)


class PoisonedRow:
    """The package's step with row `row`'s logits made non-finite (`value`) at its `at`-th call:
    what a NaN weight, NaN scales or an fp16 overflow do to one sequence."""

    def __init__(self, package, row: int, at: int, value: float):
        self.package, self.row, self.at, self.value = package, row, at, value
        self.calls = 0
        self.call = package.call_without_graphs

    def __call__(self, *tensors):
        logits = self.call(*tensors)
        self.calls += 1
        if self.calls == self.at:
            logits = logits.clone()
            logits[self.row, 100] = self.value
        return logits


@pytest.mark.parametrize("overlap", [False, True], ids=["", "step-ahead"])
@pytest.mark.parametrize(
    "value, sampling",
    [
        (float("nan"), Sampling(temperature=0.7, seed=1)),
        (float("inf"), Sampling(temperature=0.7, top_p=0.9, seed=1)),
        (float("nan"), GREEDY),
    ],
    ids=["nan-sampled", "inf-filtered", "nan-greedy"],
)
def test_a_row_with_non_finite_logits_ends_alone_and_the_batch_goes_on(
    generation_packages, monkeypatch, value, sampling, overlap
):
    """The row ends with FinishReason.ERROR at that step (no token outside the vocabulary reaches the
    model: the next step would abort the process); its neighbour's tokens are still its lone
    `generate`'s, and the same batch then takes a new sequence into the freed row and answers it
    correctly."""
    package = aotc_runtime.load(generation_packages["gpt2"][0])
    expected = {"a": alone(package, [5, 17, 42, 9, 100], 12),
                "c": alone(package, [11, 12, 13, 14], 5)}  # fmt: skip
    batch = DecodeEngine(package, overlap=overlap)
    batch.join("a", request([5, 17, 42, 9, 100], 12))
    batch.join("b", request([7, 8, 300], 10, sampling))
    # calls: 1 the prefill of both, then one a step; b's logits turn non-finite at call 4
    monkeypatch.setattr(package, "call_without_graphs", PoisonedRow(package, 1, 4, value))
    made: dict = {"a": [], "b": [], "c": []}
    finishes: dict = {}
    for _step in range(40):
        if "b" in finishes and "c" not in finishes and not made["c"] and batch.has_free_row:
            batch.join("c", request([11, 12, 13, 14], 5))
        for new in batch.step():
            assert 0 <= new.token < package.generation.vocab_size
            made[new.key].append(new.token)
            if new.finish is not None:
                finishes[new.key] = new.finish
        if not batch.active:
            break
    assert finishes == {"a": FinishReason.LENGTH, "b": FinishReason.ERROR, "c": FinishReason.LENGTH}
    assert len(made["b"]) == 4  # its fourth token's logits were the non-finite ones
    assert made["a"] == expected["a"] and made["c"] == expected["c"]


def test_generate_raises_the_non_finite_error_in_one_line(generation_packages, monkeypatch):
    package = aotc_runtime.load(generation_packages["gpt2"][0])
    monkeypatch.setattr(package, "call_without_graphs", PoisonedRow(package, 0, 2, float("nan")))
    with pytest.raises(aotc_runtime.NonFiniteLogitsError) as error:
        package.generate(torch.tensor([[5, 17, 42]]), max_new_tokens=6, temperature=0.7, seed=1)
    assert "logits for prompt 0 were not finite" in str(error.value)
    assert error.value.exit_code == 3 and "\n" not in str(error.value)


def test_a_step_is_fed_only_the_tokens_of_the_rows_in_use(generation_packages):
    """A package of 4 rows: one sequence is fed its own tokens alone, two theirs packed (a joining
    prompt beside a decode is fed its 3 tokens and the decode 1, no padded window), and each gets
    transformers' greedy tokens."""
    folder, model = generation_packages.four_rows("llama")
    package = aotc_runtime.load(folder)
    assert package.fixed_picks is None
    tokens_fed, picked = [], []
    call = package.call_without_graphs

    def counting(*tensors):
        tokens_fed.append(tensors[0].shape[0])
        picked.append(tensors[3].shape[0])
        return call(*tensors)

    package.call_without_graphs = counting
    plan = {0: ("a", [5, 17, 42, 9, 100], 8), 2: ("b", [7, 8, 300], 3)}
    made = run(DecodeEngine(package), plan)
    # a's prompt, a decode, b's prompt beside a's decode, two decodes of both, a alone again
    assert tokens_fed == [5, 1, 4, 2, 2, 1, 1, 1]
    assert picked == [1, 1, 2, 2, 2, 1, 1, 1]
    for key, prompt, new in plan.values():
        with torch.no_grad():
            expected = model.generate(
                torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False
            )
        assert made[key] == expected[0, len(prompt) :].tolist(), key
