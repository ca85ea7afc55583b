"""Prompt prefixes reused from the KV cache (runtime/aotc_runtime/prefix_cache.py): the cache's
rules on their own, then the decode engine with one against the fake package of
tests/fake_generation.py (whose next token is a hash of a row's whole cache, so a prefix copied
wrong, reused past what a row holds, or kept after someone else moved the cache changes the
tokens), then a compiled package against the same engine without a cache."""

from __future__ import annotations

import pytest
import torch
from fake_generation import FakeGeneration, greedy_alone
from test_decode_engine_fake import HOT, ahead_of, engine_alone, request, run, tokens

from aotc_runtime.decode_engine import DecodeEngine
from aotc_runtime.prefix_cache import PrefixCache, common_start

SYSTEM = list(range(20, 40))  # 20 tokens a conversation starts with
OVERLAP = pytest.mark.parametrize("overlap", [0, 1], ids=["", "step-ahead"])


@pytest.mark.parametrize(
    "a, b, n",
    [([], [1], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 2], 2), ([1, 2, 3], [1, 9, 3], 1),
     ([4] + list(range(100)), [4] + list(range(57)) + [0], 58), ([1], [2], 0)],
)  # fmt: skip
def test_the_common_start_of_two_token_lists(a, b, n):
    assert common_start(a, b) == n == common_start(b, a)


def test_the_longest_held_start_is_found_and_leaves_the_last_token_to_feed():
    cache = PrefixCache(min_reused=3)
    cache.kept(0, [1, 2, 3, 4])
    cache.kept(1, [1, 2, 3, 4, 5, 6])
    assert cache.find([1, 2, 3, 4, 5, 6, 7], {}) == (1, 6)
    assert cache.find([1, 2, 3, 4, 5, 6], {}) == (1, 5)  # the step feeding the last makes a token
    assert cache.find([1, 2, 3, 9], {}) == (0, 3)  # equal starts: the first row found
    assert cache.find([1, 2, 9], {}) == (None, 0)  # 2 tokens: below min_reused
    running = {2: [1, 2, 3, 4, 5, 6, 7, 8]}
    assert cache.find([1, 2, 3, 4, 5, 6, 7, 9], running) == (2, 7)  # a running row holds more
    assert cache.find([1, 2, 3, 4, 9], {2: [1, 2, 3, 4, 5]}) == (0, 4)  # tie: the free row


def test_a_row_without_a_prefix_goes_to_the_least_recently_used_free_row():
    cache = PrefixCache(min_reused=2)
    cache.kept(0, [1, 2])
    cache.kept(1, [3, 4])
    cache.kept(2, [5, 6])
    cache.kept(0, [1, 2, 7])  # row 0 used again, after the others
    assert cache.row_for([0, 1, 2]) == 1
    assert cache.row_for([0, 2, 3]) == 3  # a row that holds nothing first
    cache.kept(3, [9])  # too short to keep: the row holds nothing worth finding
    assert 3 not in cache.held


def test_anyone_else_taking_the_package_forgets_what_the_rows_held():
    cache = PrefixCache(min_reused=2)
    cache.claim(1)
    cache.kept(0, [1, 2, 3])
    cache.claim(2)  # the same cache's next engine, nobody in between
    assert cache.find([1, 2, 3, 4], {}) == (0, 3)
    cache.claim(4)  # a call or a reset took the gate at turn 3
    assert cache.find([1, 2, 3, 4], {}) == (None, 0)


@OVERLAP
def test_a_conversations_next_turn_is_fed_only_its_new_tokens(overlap):
    """Turn 1 leaves its row holding its prompt and its reply (all but the last token); turn 2,
    the conversation so far and a new message, takes that row and is fed the rest only, and its
    tokens are those of the fake's rule on the whole conversation."""
    package = FakeGeneration(batch_size=2, max_seq_len=64, fewer_picks=False)
    cache = PrefixCache()
    first = request(SYSTEM + [5, 6, 7], 8)
    made, _joined, _ended = run(DecodeEngine(package, **ahead_of(overlap), prefix_cache=cache),
                                [(0, "turn 1", first)])  # fmt: skip
    reply = tokens(made["turn 1"])
    assert reply == greedy_alone(first.prompt, 8)
    conversation = list(first.prompt) + reply + [9, 10, 11]
    engine = DecodeEngine(package, **ahead_of(overlap), prefix_cache=cache)
    package.fed.clear()
    reused = engine.join("turn 2", request(conversation, 6))
    assert reused == len(first.prompt) + 7  # the last reply token was never fed
    got = []
    while engine.active:
        got += [m.token for m in engine.step()]
    assert got == greedy_alone(conversation, 6)
    assert package.fed[0] == [4, 0]  # the join step fed the reply's last token and the message
    assert package.copies == []  # the row was free: nothing to copy


@OVERLAP
def test_a_shared_system_prompt_is_copied_from_a_running_row(overlap):
    """A sequence joins while another that shares its first 20 tokens runs: those positions are
    copied into its row, and both answer as if alone."""
    package = FakeGeneration(batch_size=2, max_seq_len=64, fewer_picks=False)
    engine = DecodeEngine(package, **ahead_of(overlap), prefix_cache=PrefixCache())
    first, second = request(SYSTEM + [1, 2], 10), request(SYSTEM + [3, 4, 5], 6)
    made, _joined, _ended = run(engine, [(0, "a", first), (3, "b", second)])
    assert tokens(made["a"]) == greedy_alone(first.prompt, 10)
    assert tokens(made["b"]) == greedy_alone(second.prompt, 6)
    assert package.copies == [(0, 1, 20)]


def test_a_prompt_whose_start_is_being_fed_waits_and_then_copies_it():
    """Two sequences that share a 20-token start arrive together: the second waits while the
    first is fed its prompt in chunks of 4, then joins with those 20 positions copied (fed 3
    tokens, not 23); a prompt sharing less than min_reused does not wait."""
    package = FakeGeneration(batch_size=2, max_seq_len=64, fewer_picks=False)
    engine = DecodeEngine(package, prefill_chunk=4, prefix_cache=PrefixCache())
    first, second = request(SYSTEM + [1, 2], 5), request(SYSTEM + [3, 4, 5], 5)
    assert not engine.waits_for_prefix(second.prompt)  # nothing is being fed yet
    engine.join("a", first)
    made = {"a": [], "b": []}
    waited = 0
    while engine.waits_for_prefix(second.prompt):
        assert not engine.waits_for_prefix(SYSTEM[:10] + [7, 7, 7])
        made["a"] += [m.token for m in engine.step()]
        waited += 1
    assert waited == 5  # 20 of the 22 tokens fed; the step after feeds the last 2 with the copy
    assert engine.join("b", second) == 20 and package.copies == [(0, 1, 20)]
    while engine.active:
        for m in engine.step():
            made[m.key].append(m.token)
    assert made == {"a": greedy_alone(first.prompt, 5), "b": greedy_alone(second.prompt, 5)}


def test_a_seeded_sampled_sequence_draws_the_same_tokens_from_a_reused_prefix():
    package = FakeGeneration(batch_size=2, max_seq_len=64)
    cache = PrefixCache()
    run(DecodeEngine(package, prefix_cache=cache), [(0, "warm", request(SYSTEM + [1], 3))])
    asked = request(SYSTEM + [2, 3], 8, HOT)
    made, _joined, _ended = run(DecodeEngine(package, prefix_cache=cache), [(0, "hot", asked)])
    assert cache.reused_tokens == len(SYSTEM)
    assert tokens(made["hot"]) == tokens(engine_alone(list(asked.prompt), 8, HOT))


def test_the_least_recently_used_prefix_is_evicted_first():
    """Two rows, three conversations: the third takes the row of the first, which was used
    least recently; the second's prefix is still there for its next turn."""
    package = FakeGeneration(batch_size=2, max_seq_len=64, fewer_picks=False)
    cache = PrefixCache()
    one, two, three = ([k] * 20 for k in (1, 2, 3))
    for key, prompt in (("one", one), ("two", two), ("three", three)):
        engine = DecodeEngine(package, prefix_cache=cache)
        assert engine.join(key, request(prompt, 2)) == 0
        while engine.active:
            engine.step()
    assert sorted(cache.held) == [0, 1] and cache.held[0][:20] == three
    engine = DecodeEngine(package, prefix_cache=cache)
    assert engine.join("two again", request(two + [7], 2)) == 20
    engine.release()
    engine = DecodeEngine(package, prefix_cache=cache)
    assert engine.join("one again", request(one + [7], 2)) == 0


def test_a_call_between_turns_means_nothing_is_reused():
    package = FakeGeneration(batch_size=2, max_seq_len=64)
    cache = PrefixCache()
    run(DecodeEngine(package, prefix_cache=cache), [(0, "turn 1", request(SYSTEM + [1], 3))])
    with package.generation_gate.other_work("a call of the package"):
        package.cache.zero_()  # what a plain call or reset_state may do to the cache
    asked = request(SYSTEM + [2], 4)
    engine = DecodeEngine(package, prefix_cache=cache)
    assert engine.join("turn 2", asked) == 0
    got = []
    while engine.active:
        got += [m.token for m in engine.step()]
    assert got == greedy_alone(asked.prompt, 4)


def test_a_row_whose_logits_were_not_finite_keeps_nothing():
    package = FakeGeneration(batch_size=2, max_seq_len=64, poison=99)
    cache = PrefixCache()
    run(DecodeEngine(package, prefix_cache=cache), [(0, "bad", request(SYSTEM + [99], 3))])
    assert cache.held == {}


def test_without_a_prefix_cache_nothing_is_reused():
    package = FakeGeneration(batch_size=2, max_seq_len=64)
    run(DecodeEngine(package), [(0, "turn 1", request(SYSTEM + [1], 3))])
    engine = DecodeEngine(package)
    assert engine.join("turn 2", request(SYSTEM + [2], 3)) == 0
    engine.release()


def test_a_bad_prefill_chunk_is_refused():
    with pytest.raises(ValueError, match="prefill_chunk must be at least 1 token, not 0"):
        DecodeEngine(FakeGeneration(), prefill_chunk=0)


def assert_reuse_answers_as_without(folder, vocab: int = 512) -> None:
    """A compiled package (batch 2, at least 32 positions): a second turn that takes its row
    back, and a sequence whose start is copied from a running row, give the tokens of the same
    engine without a cache on a fresh load, greedy and seeded."""
    import aotc_runtime

    g = torch.Generator().manual_seed(3)
    system = torch.randint(3, vocab, (8,), generator=g).tolist()
    first = request(system + [5, 6], 6)

    def answers(package, cache, plan) -> dict:
        engine = DecodeEngine(package, prefix_cache=cache)
        return {key: tokens(made) for key, made in run(engine, plan, vocab=vocab)[0].items()}

    lone = answers(aotc_runtime.load(folder), None, [(0, "turn 1", first)])["turn 1"]
    conversation = list(first.prompt) + lone + [7, 8]
    plans = [
        [(0, "turn 2", request(conversation, 5))],
        [(0, "a", request(system + [9], 10)), (2, "b", request(system + [10, 11], 6, HOT))],
    ]
    for plan in plans:
        package = aotc_runtime.load(folder)
        cache = PrefixCache(min_reused=4)
        assert answers(package, cache, [(0, "turn 1", first)]) == {"turn 1": lone}
        got = answers(package, cache, plan)
        assert cache.reused_tokens >= len(system)
        assert cache.copied_tokens == (len(system) if "b" in got else 0)  # from a running row
        assert got == answers(aotc_runtime.load(folder), None, plan)


@pytest.mark.slow
def test_a_compiled_package_answers_from_a_reused_prefix_as_without_one(generation_packages):
    """Llama (zoo, scaled; batch 2, 32 positions) on the CPU."""
    assert_reuse_answers_as_without(generation_packages["llama"][0])
