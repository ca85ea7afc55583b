"""The decode engine's semantics (runtime/aotc_runtime/decode_engine.py) against the fake package of
tests/fake_generation.py, whose step keeps a real per-row cache and whose next token is a hash of
a row's whole history: joins, prompts in chunks, finishes, leaving, freed rows, refusals, per-row
sampling and the sampler's modes, and non-finite rows, with no compile. A greedy sequence's tokens
are held to `greedy_alone`, the fake's rule in plain Python; a sampled one's to the engine running
it alone, its log-probabilities to the fake's logits. tests/test_decode_engine.py holds the engine
to the real compiled program."""

from __future__ import annotations

import math

import pytest
import torch
from fake_generation import (
    VOCAB,
    FakeGeneration,
    greedy_alone,
    log_softmax,
    logits_of,
)

from aotc_runtime.decode_engine import DecodeEngine, Made
from aotc_runtime.errors import GenerationInputError
from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.generation_request import GenerationRequest
from aotc_runtime.sampling import GREEDY, Sampling

A, B, C = [5, 17, 42, 9, 100], [7, 8, 100], [11, 12, 13, 14]
LONG = [7, 8, 99, 4, 9, 11, 120, 31, 77, 2, 19, 60, 8, 101]  # 14 tokens
MIDDLE = [3, 1, 4, 1, 5, 9, 2]
REPEATS = [8, 9, 10, 11]  # its greedy second token is 8, a token of the prompt
HOT = Sampling(temperature=0.9, top_k=50, top_p=0.95, seed=7)
# how far the engine works ahead of the host: not at all, one decode step (CUDA's default), three
OVERLAP = pytest.mark.parametrize("overlap", [0, 1, 3], ids=["", "step-ahead", "3-steps-ahead"])


def ahead_of(overlap: int) -> dict:
    """DecodeEngine's arguments for `overlap` steps queued ahead (0: none)."""
    return {"overlap": bool(overlap), "ahead": max(overlap, 1)}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The engine's tensors here are a few rows of 128 values: a second thread only adds each
    parallel region's start (milliseconds a call while the other core is busy)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def request(
    prompt: list, new_tokens: int, sampling: Sampling = GREEDY, **options
) -> GenerationRequest:
    """No end-of-sequence id unless given: a sequence makes all its tokens."""
    options.setdefault("eos_token_ids", ())
    return GenerationRequest(tuple(prompt), new_tokens, sampling, **options)


def run(engine: DecodeEngine, plan: list, vocab: int = VOCAB) -> tuple[dict, dict, dict]:
    """plan: (step, key, request) of each sequence. Each joins at the first step from its own at
    which the batch fits it, none overtaking one that came before it (a server's queue); steps
    until all have finished. (key -> its Made tokens, key -> the step it joined at, key -> the step
    of its last token); every token is inside the vocabulary, and only a sequence's last one has a
    finish."""
    waiting = sorted(plan, key=lambda arrival: arrival[0])
    made: dict = {key: [] for _at, key, _asked in plan}
    joined: dict = {}
    ended: dict = {}
    step = 0
    while waiting or engine.active:
        while waiting and waiting[0][0] <= step:
            _at, key, asked = waiting[0]
            if not engine.has_free_row:
                break
            engine.join(key, asked)
            joined[key] = step
            waiting.pop(0)
        for new in engine.step():
            assert 0 <= new.token < vocab, new
            assert not made[new.key] or made[new.key][-1].finish is None, new
            made[new.key].append(new)
            if new.finish is not None:
                ended[new.key] = step
        step += 1
        assert step < 200
    return made, joined, ended


def tokens(made: list[Made]) -> list[int]:
    return [m.token for m in made]


def finishes(made: list[Made]) -> list:
    return [m.finish for m in made]


def engine_alone(prompt: list, new_tokens: int, sampling: Sampling, logprobs=None) -> list[Made]:
    """A sequence's tokens from the engine on a fresh fake, with nothing beside it."""
    asked = request(prompt, new_tokens, sampling, logprobs=logprobs)
    made, _joined, _ended = run(DecodeEngine(FakeGeneration()), [(0, "alone", asked)])
    return made["alone"]


def assert_given_back(package: FakeGeneration) -> None:
    """The engine released the package's generation gate: another generation opens at once (in
    the thread that holds it, acquire() would raise GenerationBusyError)."""
    package.generation_gate.acquire()
    package.generation_gate.release()


JOINS = {"apart": (0, 3, 10), "close": (0, 1, 2), "together": (0, 0, 0)}


@OVERLAP
@pytest.mark.parametrize("joins", JOINS.values(), ids=JOINS)
def test_sequences_joining_a_running_batch_get_their_own_tokens(joins, overlap):
    """Batch 2: b joins beside a running a, c into a row another sequence left (waiting for it
    when none is free); each gets its tokens alone, and the batch gives the package back."""
    package = FakeGeneration(batch_size=2)
    sequences = [("a", A, 14), ("b", B, 6), ("c", C, 5)]
    plan = [(at, key, request(prompt, new)) for at, (key, prompt, new) in zip(joins, sequences)]
    made, joined, ended = run(DecodeEngine(package, **ahead_of(overlap)), plan)
    for key, prompt, new in sequences:
        assert tokens(made[key]) == greedy_alone(prompt, new), key
        assert finishes(made[key]) == [None] * (new - 1) + [FinishReason.LENGTH], key
    # c joins at its step, or at the step after b's last token (with a step queued ahead when b
    # joined, b's prompt waited a step for it)
    assert joined["b"] == joins[1] and joined["c"] == max(joins[2], ended["b"] + 1)
    assert_given_back(package)


@OVERLAP
@pytest.mark.parametrize("chunk, joins", [(4, (0, 2, 2)), (3, (0, 1, 5)), (5, (0, 6, 3))])
def test_long_prompts_join_in_chunks_beside_running_rows(chunk, joins, overlap):
    """Prompts longer than the chunk, joining at once or apart: a step's window holds each joining
    row's chunk at its end (a shorter chunk left-padded) and each running row's last token."""
    package = FakeGeneration(batch_size=3)
    sequences = [("a", A, 12), ("b", LONG, 6), ("c", MIDDLE, 5)]
    plan = [(at, key, request(prompt, new)) for at, (key, prompt, new) in zip(joins, sequences)]
    made, _joined, _ended = run(
        DecodeEngine(package, **ahead_of(overlap), prefill_chunk=chunk), plan
    )
    for key, prompt, new in sequences:
        assert tokens(made[key]) == greedy_alone(prompt, new), key
    assert max(map(max, package.fed)) == chunk  # no row is fed more than a chunk a step


def test_a_join_feeds_a_chunk_a_step_and_costs_the_running_row_no_step():
    """Chunks of 4: a's 5-token prompt takes 2 steps; b's 14 take 4, each of which also feeds a
    its last token and makes a's next one (the calls' input lengths say what each row was fed)."""
    package = FakeGeneration(batch_size=2)
    engine = DecodeEngine(package, prefill_chunk=4)
    engine.join("a", request(A, 12))
    assert engine.step() == []
    assert [m.key for m in engine.step()] == ["a"]
    engine.join("b", request(LONG, 6))
    keys = [[m.key for m in engine.step()] for _ in range(4)]
    assert keys == [["a"], ["a"], ["a"], ["a", "b"]]
    # until b joins, a step feeds a's row alone: the free row costs nothing
    assert package.fed == [[4, 0], [1, 0], [1, 4], [1, 4], [1, 4], [1, 2]]
    engine.step()
    assert package.fed[-1] == [1, 1]  # a decode step: one token each
    engine.release()
    assert_given_back(package)


def test_joining_prompts_share_a_steps_token_budget_oldest_first():
    """Three prompts join a running row at once, within 6 prompt tokens a step (chunks of 4 a
    row): the oldest joiner is fed first, a later one gets what the budget leaves, and the running
    row is fed its token every step beside them; each answers as alone."""
    package = FakeGeneration(batch_size=4)
    engine = DecodeEngine(package, prefill_chunk=4, step_tokens=6)
    engine.join("a", request(A, 12))
    made = engine.step() + engine.step()  # a's 5 tokens in chunks of 4 and 1
    for key, prompt in (("b", B), ("c", C), ("long", LONG)):
        engine.join(key, request(prompt, 3))
    while engine.active:
        made += engine.step()
    for key, prompt, new in (("a", A, 12), ("b", B, 3), ("c", C, 3), ("long", LONG, 3)):
        assert tokens([m for m in made if m.key == key]) == greedy_alone(prompt, new), key
    # a's prompt in chunks of 4; then b's 3 and 3 of c's (the oldest first, 6 a step), c's last
    # and 4 of the long one's beside b's token, ...; a fed its one token beside them all along
    assert package.fed[:5] == [[4, 0, 0, 0], [1, 0, 0, 0], [1, 3, 3, 0], [1, 1, 1, 4],
                               [1, 1, 1, 4]]  # fmt: skip
    assert_given_back(package)


@pytest.mark.parametrize("fewer_picks", [True, False], ids=["picks-a-dim", "picks-the-batch"])
def test_a_step_feeds_only_the_rows_a_sequence_holds(fewer_picks):
    """Batch 4: a alone is fed one row's tokens a step; b joins a free row, and the steps feed
    both until b's last token, then a's row alone again, whichever rows they are. A package whose
    step picks the whole batch's logits (a batch of 1 or 2) is fed the same tokens."""
    package = FakeGeneration(batch_size=4, fewer_picks=fewer_picks)
    engine = DecodeEngine(package)
    engine.join("a", request(A, 8))
    made = engine.step() + engine.step()
    engine.join("b", request(B, 3))
    while engine.active:
        made += engine.step()
    assert tokens([m for m in made if m.key == "a"]) == greedy_alone(A, 8)
    assert tokens([m for m in made if m.key == "b"]) == greedy_alone(B, 3)
    fed = [[5], [1], [1, 3], [1, 1], [1, 1], [1], [1], [1]]
    assert package.fed == [row + [0] * (4 - len(row)) for row in fed]
    assert package.past_cache == 0  # no token is no row's: a free row is not fed
    assert_given_back(package)


@OVERLAP
def test_a_sequence_ends_at_its_end_of_sequence_id_and_frees_its_row_for_the_next(overlap):
    """a takes the package's end-of-sequence ids (the record's), b and c none: a ends with STOP
    at the first time its model says the id, and c, waiting for a row, joins at the next step."""
    lone = greedy_alone(A, 12)
    eos = lone[3]
    ends = lone.index(eos) + 1
    package = FakeGeneration(batch_size=2, eos_token_ids=(eos,))
    plan = [
        (0, "a", request(A, 12, eos_token_ids=None)),
        (0, "b", request(B, 10)),
        (0, "c", request(C, 5)),
    ]
    made, joined, ended = run(DecodeEngine(package, **ahead_of(overlap)), plan)
    assert tokens(made["a"]) == lone[:ends]
    assert finishes(made["a"]) == [None] * (ends - 1) + [FinishReason.STOP]
    assert ended["a"] == ends - 1 and joined["c"] == ends  # the step after a's last token
    assert tokens(made["b"]) == greedy_alone(B, 10) and tokens(made["c"]) == greedy_alone(C, 5)
    assert_given_back(package)


LONE = greedy_alone(A, 8)  # [2, 121, 105, 101, ...]: 101 is said first at the fourth token
FINISHES = {
    "length": ({}, 8, FinishReason.LENGTH),
    "eos": ({"eos_token_ids": (LONE[3],)}, 4, FinishReason.STOP),
    "first-of-two-eos": ({"eos_token_ids": (LONE[3], LONE[1])}, 2, FinishReason.STOP),
    "package-eos": ({"eos_token_ids": None}, 4, FinishReason.STOP),
    "ignore-eos": ({"eos_token_ids": (LONE[3],), "ignore_eos": True}, 8, FinishReason.LENGTH),
    "ignore-package-eos": ({"eos_token_ids": None, "ignore_eos": True}, 8, FinishReason.LENGTH),
}


@pytest.mark.parametrize("options, ends, finish", FINISHES.values(), ids=FINISHES)
def test_finish_reasons(options, ends, finish):
    """GenerationRequest.finish_reason decides for the engine: STOP at an end-of-sequence id (the
    request's, else the package's; never with ignore_eos), LENGTH at the last token."""
    package = FakeGeneration(eos_token_ids=(LONE[3],))
    made, _joined, _ended = run(DecodeEngine(package), [(0, "a", request(A, 8, **options))])
    assert tokens(made["a"]) == LONE[:ends]
    assert finishes(made["a"]) == [None] * (ends - 1) + [finish]
    assert type(made["a"][-1].finish) is FinishReason  # the member, not a string equal to it


@OVERLAP
def test_a_sequence_joins_whenever_a_row_is_free_and_its_cache_holds_it(overlap):
    """Rows have timelines of their own: a row that ran long does not shorten another's, and a
    sequence that fills its row to the last position runs to its end, no step (one queued ahead
    included) feeding it past its cache."""
    package = FakeGeneration(batch_size=2, max_seq_len=32)
    engine = DecodeEngine(package, **ahead_of(overlap))
    engine.join("a", request([5, 6, 7], 29))
    made: list[Made] = []
    for _ in range(10):
        made += engine.step()
    # a holds about a third of its row's 32 positions; the other row holds a whole 30 + 2 (the
    # request's own check against the package; a row's room is never the engine's to judge)
    assert engine.has_free_row
    request([1] * 30, 2).check(package.generation)
    with pytest.raises(GenerationInputError, match="need 33 positions"):
        request([1] * 31, 2).check(package.generation)
    whole = [(7 * i) % VOCAB for i in range(1, 31)]
    engine.join("b", request(whole, 2))
    assert not engine.has_free_row  # batch of 2
    with pytest.raises(ValueError, match="every row of the batch is taken; check has_free_row"):
        engine.join("c", request([1], 1))
    while engine.active:
        made += engine.step()
    assert tokens([m for m in made if m.key == "a"]) == greedy_alone([5, 6, 7], 29)
    assert tokens([m for m in made if m.key == "b"]) == greedy_alone(whole, 2)
    assert package.past_cache == 0  # a's row to its last position, and not past it
    assert_given_back(package)


@pytest.mark.parametrize("ahead", [1, 3])
def test_decode_steps_are_queued_ahead_of_the_host_and_never_past_a_rows_last_token(ahead):
    """With overlap, each read of a step finds `ahead` more decode steps queued behind it (the
    device never waits for the host), but a step is queued only while a row needs a token beyond
    those already queued, and it feeds only such rows: a row's last token ends what it is fed."""
    package = FakeGeneration(batch_size=2, max_seq_len=32)
    engine = DecodeEngine(package, overlap=True, ahead=ahead)
    engine.join("short", request([1, 2], 3))
    engine.join("long", request([3, 4], 12))
    made = engine.step()  # the join step, and `ahead` decode steps queued behind it
    assert len(package.fed) == 1 + ahead and [m.key for m in made] == ["short", "long"]
    while engine.active:
        made += engine.step()
    assert tokens([m for m in made if m.key == "short"]) == greedy_alone([1, 2], 3)
    assert tokens([m for m in made if m.key == "long"]) == greedy_alone([3, 4], 12)
    # "short" is fed its prompt and then its first two tokens (its third is its last), "long"
    # its prompt and 11 tokens: no step beyond a row's last token, none after the last row's
    assert [fed[0] for fed in package.fed] == [2, 1, 1] + [0] * 9
    assert [fed[1] for fed in package.fed] == [2] + [1] * 11
    assert_given_back(package)


REFUSED = {
    "past-the-cache": (
        request([1] * 31, 2),
        r"^a prompt of 31 tokens and 2 new tokens need 33 positions, but the package's KV cache "
        r"holds 32; shorten the prompt to at most 30 tokens",
    ),
    "outside-the-vocabulary": (request([5, VOCAB], 2), r"^token id 128 is outside the vocabulary"),
    "eos-outside": (request([5], 2, eos_token_ids=(VOCAB,)), r"^end-of-sequence id 128 is outside"),
}


@pytest.mark.parametrize("asked, message", REFUSED.values(), ids=REFUSED)
def test_a_sequence_the_package_can_never_run_is_refused_and_holds_nothing(asked, message):
    """The request is checked against the package's record before it takes a row: one line, and
    the engine and the package are as before (a sequence then runs as it would have)."""
    package = FakeGeneration(batch_size=2, max_seq_len=32)
    engine = DecodeEngine(package)
    with pytest.raises(GenerationInputError, match=message):
        engine.join("x", asked)
    assert engine.active == 0 and package.fed == []
    assert_given_back(package)
    made, _joined, _ended = run(engine, [(0, "a", request(B, 4))])
    assert tokens(made["a"]) == greedy_alone(B, 4)


@OVERLAP
def test_greedy_and_sampled_sequences_share_a_running_batch(overlap):
    """Each row picks by its own settings: the greedy b's tokens are the rule's, and the seeded a
    and c get the tokens they get alone, whoever joins or leaves beside them."""
    plan = [
        (0, "a", request(A, 14, HOT)),
        (2, "b", request(B, 6)),  # greedy beside the sampled a
        (9, "c", request(C, 5, Sampling(temperature=1.3, seed=3))),  # into b's row
    ]
    made, _joined, _ended = run(
        DecodeEngine(FakeGeneration(batch_size=2), **ahead_of(overlap)), plan
    )
    for _at, key, asked in plan:
        lone = engine_alone(list(asked.prompt), asked.max_new_tokens, asked.sampling)
        assert tokens(made[key]) == tokens(lone), key
    assert tokens(made["b"]) == greedy_alone(B, 6)
    assert tokens(made["a"]) != greedy_alone(A, 14), "sampling was not used"
    assert tokens(made["c"]) != greedy_alone(C, 5), "sampling was not used"


NEIGHBOURS = {
    "greedy-first": [(0, "n", request(LONG, 12))],
    "sampled-first": [(0, "n", request(B, 3, Sampling(temperature=1.0, seed=99)))],
    "joining-later": [(3, "n", request(LONG, 6, Sampling(temperature=0.5, seed=1)))],
    "two-in-turn": [(0, "n", request(C, 2, HOT)), (4, "m", request(MIDDLE, 9))],
}


@OVERLAP
@pytest.mark.parametrize("neighbours", NEIGHBOURS.values(), ids=NEIGHBOURS)
def test_a_seeded_row_draws_the_same_tokens_whoever_its_neighbours_are(neighbours, overlap):
    """The draws are a hash of the row's seed and its count of tokens: not of its slot, of its
    neighbours' draws or prompts (fed in chunks of 3 beside it), nor of when it joined."""
    plan = [*neighbours, (1, "s", request(A, 12, HOT))]
    package = FakeGeneration(batch_size=2)
    made, _joined, _ended = run(DecodeEngine(package, **ahead_of(overlap), prefill_chunk=3), plan)
    assert tokens(made["s"]) == tokens(engine_alone(A, 12, HOT))
    other = tokens(engine_alone(A, 12, Sampling(temperature=0.9, top_k=50, top_p=0.95, seed=8)))
    assert tokens(made["s"]) != other, "the seed was not used"


def expected_logprobs(prompt: list, made: list[Made], count: int) -> None:
    """Each of a row's log-probabilities is the log-softmax of the fake's logits after the row's
    history at that step, and its most likely tokens those logits' largest."""
    for index, new in enumerate(made):
        reference = log_softmax(logits_of(prompt + tokens(made[:index])))
        assert new.logprob == pytest.approx(reference[new.token], abs=1e-5)
        ranked = sorted(range(VOCAB), key=lambda token: -reference[token])[:count]
        assert [token for token, _value in new.top_logprobs] == ranked
        assert [value for _token, value in new.top_logprobs] == pytest.approx(
            [reference[token] for token in ranked], abs=1e-5
        )


def test_the_sampler_mode_follows_the_running_rows():
    """The sampler does a step's extra work (a draw, filters, penalties, log-probabilities) only
    while a running row asks for it; a row that asks for no log-probabilities gets none, and one
    that does gets those of its own logits."""
    package = FakeGeneration(batch_size=2)
    engine = DecodeEngine(package)
    engine.join("a", request(A, 12))
    made = engine.step()
    assert engine.sampler.mode == "greedy"
    engine.join("b", request(B, 3, Sampling(temperature=0.9, seed=1), logprobs=2))
    assert engine.sampler.mode == "sampled+logprobs"
    while not any(m.key == "b" and m.finish for m in made):
        made += engine.step()
    assert engine.sampler.mode == "greedy"  # b finished: its row draws nothing
    engine.join("c", request(REPEATS, 3, Sampling(top_k=5, temperature=0.5, repetition_penalty=8)))
    assert engine.sampler.mode == "filtered+penalties"
    while engine.active:
        made += engine.step()
    assert engine.sampler.mode == "greedy"
    by_key = {key: [m for m in made if m.key == key] for key in "abc"}
    assert tokens(by_key["a"]) == greedy_alone(A, 12)
    assert all(m.logprob is None and m.top_logprobs == () for m in by_key["a"] + by_key["c"])
    expected_logprobs(B, by_key["b"], 2)
    assert_given_back(package)


@OVERLAP
def test_penalized_and_logprob_rows_share_a_running_batch(overlap):
    """Each row its own settings, counts and log-probabilities: a row's tokens beside others,
    joining and leaving, are its lone run's; its penalty counts start again when a sequence takes
    a row a penalized one left; the repetition penalty changes what the rule alone says."""
    hot = Sampling(temperature=0.9, top_k=50, min_p=0.05, presence_penalty=1.0, seed=7)
    plan = [
        (0, "a", request(A, 12, hot, logprobs=3)),
        (2, "b", request(B, 5)),  # greedy beside the penalized, sampled a
        (
            8,
            "c",
            request(REPEATS, 6, Sampling(repetition_penalty=8, frequency_penalty=2), logprobs=0),
        ),
        (15, "d", request([9, 9, 9], 4, Sampling(frequency_penalty=-2.0))),  # into a penalized row
    ]
    made, _joined, _ended = run(
        DecodeEngine(FakeGeneration(batch_size=2), **ahead_of(overlap)), plan
    )
    for _at, key, asked in plan:
        prompt = list(asked.prompt)
        lone = engine_alone(prompt, asked.max_new_tokens, asked.sampling, asked.logprobs)
        assert tokens(made[key]) == tokens(lone), key
        if asked.logprobs is None:
            assert all(m.logprob is None and m.top_logprobs == () for m in made[key]), key
        else:
            expected_logprobs(prompt, made[key], asked.logprobs)
    assert tokens(made["b"]) == greedy_alone(B, 5)
    assert tokens(made["c"])[0] == greedy_alone(REPEATS, 6)[0]
    assert tokens(made["c"])[1] != greedy_alone(REPEATS, 6)[1] == REPEATS[0], "no penalty"


@OVERLAP
def test_join_steps_through_the_decode_graphs_surface_make_the_tokens_made_without_it(overlap):
    """The engine's path through cuda_graphs.DecodeGraph.join (the step's inputs as lists, one
    pick and one drawing flag per row, the sampler's mode), here through the fake's eager
    stand-in padded to a bucket: greedy, sampled, penalized and logprob rows, their prompts in
    chunks beside running rows, make the tokens and log-probabilities they make without it."""
    hot = Sampling(temperature=0.9, top_k=50, min_p=0.05, presence_penalty=1.0, seed=7)
    plan = [
        (0, "a", request(LONG, 10, hot, logprobs=3)),
        (1, "b", request(MIDDLE, 6)),
        (3, "c", request(REPEATS, 8, Sampling(repetition_penalty=8, seed=2), logprobs=0)),
        (9, "d", request(A, 5, Sampling(temperature=1.3, seed=3))),  # into a row b or c left
    ]
    package = FakeGeneration(batch_size=3, with_graph=True)
    made, _joined, _ended = run(DecodeEngine(package, prefill_chunk=4, **ahead_of(overlap)), plan)
    plain = FakeGeneration(batch_size=3)
    without, _joined, _ended = run(DecodeEngine(plain, prefill_chunk=4, **ahead_of(overlap)), plan)
    assert made == without
    assert package.graph is not None and len(package.graph.joins) >= 6
    assert "filtered+penalties+logprobs" in package.graph.joins


NON_FINITE = {
    "nan-sampled": (math.nan, Sampling(temperature=0.7, seed=1)),
    "inf-filtered": (math.inf, Sampling(temperature=0.7, top_p=0.9, seed=1)),
    "nan-greedy": (math.nan, GREEDY),
}
POISON_PROMPT = [7, 8, 60]  # 60: in neither neighbour's history (a and c below)


@OVERLAP
@pytest.mark.parametrize("at", [1, 4], ids=["first-token", "fourth-token"])
@pytest.mark.parametrize("value, sampling", NON_FINITE.values(), ids=NON_FINITE)
def test_a_row_with_non_finite_logits_ends_alone_and_the_batch_goes_on(
    value, sampling, at, overlap
):
    """The fake's logits turn non-finite once a row holds the poison token: b's prompt's last
    token, or b's own third token. b ends with FinishReason.ERROR at that step, its token inside the
    vocabulary; its neighbour's tokens are still the rule's, and the freed row (still holding the
    poison) takes a new sequence, emptied, that gets its own tokens."""
    lone = tokens(engine_alone(POISON_PROMPT, 3, sampling))
    if at == 1:  # the prompt's last token
        poison, before = POISON_PROMPT[-1], POISON_PROMPT[:-1]
    else:  # b's third token, as it draws it alone (and so beside a)
        poison, before = lone[2], POISON_PROMPT + lone[:2]
    assert poison not in before, "pick another prompt"
    for prompt, new in ((A, 12), (C, 5)):
        assert poison not in prompt + greedy_alone(prompt, new), "pick another prompt"
    package = FakeGeneration(batch_size=2, poison=poison, poison_value=value)
    engine = DecodeEngine(package, **ahead_of(overlap))
    engine.join("a", request(A, 12))
    engine.join("b", request(POISON_PROMPT, 10, sampling))
    made: dict = {"a": [], "b": [], "c": []}
    for _step in range(40):
        # c into b's freed row (a step queued ahead may hold c's first token back: has_free_row is
        # then False, the batch full)
        if made["b"] and made["b"][-1].finish and not made["c"] and engine.has_free_row:
            engine.join("c", request(C, 5))
        for new in engine.step():
            assert 0 <= new.token < VOCAB
            made[new.key].append(new)
        if not engine.active:
            break
    assert {key: made[key][-1].finish for key in made} == {
        "a": FinishReason.LENGTH,
        "b": FinishReason.ERROR,
        "c": FinishReason.LENGTH,
    }
    assert finishes(made["b"]) == [None] * (at - 1) + [FinishReason.ERROR]
    assert tokens(made["b"])[: at - 1] == lone[: at - 1]
    assert tokens(made["a"]) == greedy_alone(A, 12) and tokens(made["c"]) == greedy_alone(C, 5)
    assert_given_back(package)


@OVERLAP
def test_a_sequence_that_leaves_frees_its_row_and_gets_no_more_tokens(overlap):
    """leave() frees the row from the next step (a step already queued for it drops its token);
    the next sequence takes it, and the last one leaving gives the package back."""
    package = FakeGeneration(batch_size=2)
    engine = DecodeEngine(package, **ahead_of(overlap))
    engine.join("a", request(A, 12))
    engine.join("b", request(B, 10))
    made: list[Made] = []
    for _ in range(3):
        made += engine.step()
    engine.leave("b")
    assert engine.active == 1 and engine.has_free_row
    engine.join("c", request(C, 5))
    while engine.active:
        made += engine.step()
    by_key = {key: tokens([m for m in made if m.key == key]) for key in "abc"}
    assert by_key == {"a": greedy_alone(A, 12), "b": greedy_alone(B, 3), "c": greedy_alone(C, 5)}
    engine.join("d", request(MIDDLE, 10))
    assert [m.key for m in engine.step()] == ["d"]
    engine.leave("d")
    assert engine.active == 0
    assert_given_back(package)


def test_stop_strings_without_a_tokenizer_are_refused_and_hold_nothing():
    """Stop strings are text: an engine given no tokenizer refuses them in one line, before it
    takes the package."""
    package = FakeGeneration()
    engine = DecodeEngine(package)
    stopped = GenerationRequest((5, 6), 4, GREEDY, eos_token_ids=(), stop=("w9",))
    with pytest.raises(
        GenerationInputError, match="^stop strings are text: they need the package's tokenizer"
    ):
        engine.join("a", stopped)
    assert engine.active == 0 and engine.sampler is None
    assert_given_back(package)


def test_a_stop_string_ends_a_row_in_its_text_and_frees_it(tokenizer):
    """With the tokenizer (tiny_tokenizer: id t is the word "wt"), a row ends with STOP at the
    token whose text completes a stop string, sending the text before it; its neighbour goes on."""
    lone = greedy_alone(A, 12)
    stop = f" w{lone[4]}"
    texts = [tokenizer.decode(lone[: end + 1]) for end in range(len(lone))]
    ends = next(end for end, text in enumerate(texts) if stop in text) + 1
    engine = DecodeEngine(FakeGeneration(batch_size=2), tokenizer=tokenizer)
    plan = [
        (0, "a", request(A, 12, stop=(stop,))),
        (0, "b", request(B, 6)),
        (1, "c", request(C, 3)),
    ]
    made, joined, ended = run(engine, plan)
    assert tokens(made["a"]) == lone[:ends]
    assert finishes(made["a"]) == [None] * (ends - 1) + [FinishReason.STOP]
    assert "".join(m.text for m in made["a"]) == texts[ends - 1].split(stop)[0]
    assert tokens(made["b"]) == greedy_alone(B, 6) and tokens(made["c"]) == greedy_alone(C, 3)
    assert ended["a"] == ends - 1 and joined["c"] == ends  # into a's row, the step after
