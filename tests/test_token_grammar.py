"""Output held to a grammar (runtime/aotc_runtime/token_grammar.py): the sampler's mask, and the
decode engine's constrained rows beside free ones, on the fake package (tests/fake_generation.py)
with a byte-level BPE tokenizer (tests/json_tokenizer.py). Whatever the fake's logits prefer, a
constrained row's text is JSON valid against its schema, and a free row's tokens are those it makes
alone. Bad and hostile schemas are refused by name."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from fake_generation import FakeGeneration, greedy_alone
from json_tokenizer import EOS, json_tokenizer

from aotc_runtime.decode_engine import DecodeEngine
from aotc_runtime.errors import GenerationInputError
from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.generation_request import GenerationRequest
from aotc_runtime.sampling import GREEDY, RowSampler, Sampling, allowed_tokens
from aotc_runtime.token_grammar import GrammarError, TokenGrammar, Vocabulary

pytest.importorskip("llguidance")

VOCAB = 320  # the fake model's logits: wider than the tokenizer's 300 words, as real models pad
HOT = Sampling(temperature=1.0, top_k=40, top_p=0.95, seed=3)
# the five shapes a structured answer takes: nested objects, arrays, enums, bounded numbers, and
# strings with a pattern
SHAPES = {
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "home": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 6}},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "home"],
                "additionalProperties": False,
            }
        },
        "required": ["person"],
        "additionalProperties": False,
    },
    "array": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 2,
        "maxItems": 4,
    },
    "enum": {
        "type": "object",
        "properties": {
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "ok": {"type": "boolean"},
            "none": {"type": "null"},
        },
        "required": ["unit", "ok", "none"],
        "additionalProperties": False,
    },
    "bounded": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 65},
            "score": {"type": "number", "minimum": -1, "maximum": 1},
        },
        "required": ["age", "score"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def tokenizer():
    return json_tokenizer()


@pytest.fixture(scope="module")
def vocabulary(tokenizer):
    return Vocabulary(tokenizer, VOCAB, (EOS,))


def engine_for(batch: int = 3, **options) -> DecodeEngine:
    package = FakeGeneration(batch_size=batch, max_seq_len=256, vocab_size=VOCAB)
    return DecodeEngine(package, **options)


def run_all(engine: DecodeEngine, requests: dict) -> dict:
    """Every request joined at once, stepped to its end: key -> (tokens, finish)."""
    for key, request in requests.items():
        engine.join(key, request)
    made: dict = {key: [] for key in requests}
    finish: dict = {}
    while engine.active:
        for new in engine.step():
            made[new.key].append(new.token)
            if new.finish is not None:
                finish[new.key] = new.finish
    return {key: (made[key], finish.get(key)) for key in requests}


def answer_of(tokenizer, tokens: list):
    return json.loads(tokenizer.decode([t for t in tokens if t != EOS]))


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("sampling", [GREEDY, HOT], ids=["greedy", "sampled"])
def test_a_constrained_row_answers_json_valid_against_its_schema_beside_a_free_row(
    vocabulary, tokenizer, shape, sampling
):
    schema = SHAPES[shape]
    grammar = vocabulary.json_schema(schema)
    free_prompt, free_tokens = (7, 8, 100), 40
    done = run_all(
        engine_for(tokenizer=tokenizer),
        {
            "held": GenerationRequest((5, 17, 42), 200, sampling, grammar=grammar),
            "free": GenerationRequest(free_prompt, free_tokens, GREEDY, eos_token_ids=()),
        },
    )
    tokens, finish = done["held"]
    assert finish is FinishReason.STOP, (shape, tokenizer.decode(tokens))
    jsonschema.validate(answer_of(tokenizer, tokens), schema)
    # the constrained neighbour changes nothing of the free row's tokens
    assert done["free"] == (greedy_alone(free_prompt, free_tokens, VOCAB), FinishReason.LENGTH)


def test_the_fakes_own_choice_is_not_json_so_the_mask_is_what_made_it_valid(tokenizer):
    """Without the grammar the same row's text is no JSON: the test above tests the mask."""
    tokens = greedy_alone((5, 17, 42), 30, VOCAB)
    with pytest.raises(ValueError):
        json.loads(tokenizer.decode([t for t in tokens if t < 300]))


def test_rows_of_one_grammar_each_keep_their_own_place_in_it(vocabulary, tokenizer):
    """Three rows of one TokenGrammar, joined at once, sampled with their own seeds: each answer
    valid, each equal to the same row run alone."""
    schema = SHAPES["array"]
    grammar = vocabulary.json_schema(schema)
    requests = {
        seed: GenerationRequest(
            (9, seed + 1), 60, Sampling(temperature=1.0, seed=seed), grammar=grammar
        )
        for seed in range(3)
    }
    together = run_all(engine_for(tokenizer=tokenizer), requests)
    for seed, request in requests.items():
        alone = run_all(engine_for(batch=1, tokenizer=tokenizer), {seed: request})
        assert together[seed] == alone[seed]
        jsonschema.validate(answer_of(tokenizer, together[seed][0]), schema)


def test_a_json_object_grammar_takes_any_object(vocabulary, tokenizer):
    grammar = vocabulary.json_schema(
        {
            "type": "object",
            "additionalProperties": {"type": "integer", "maximum": 9},
            "maxProperties": 3,
        }
    )
    tokens, finish = run_all(
        engine_for(tokenizer=tokenizer), {0: GenerationRequest((3,), 200, GREEDY, grammar=grammar)}
    )[0]
    assert finish is FinishReason.STOP and isinstance(answer_of(tokenizer, tokens), dict)


def test_a_constrained_row_cut_at_its_last_token_ends_with_length(vocabulary, tokenizer):
    grammar = vocabulary.json_schema(SHAPES["nested"])
    tokens, finish = run_all(
        engine_for(tokenizer=tokenizer), {0: GenerationRequest((3,), 4, GREEDY, grammar=grammar)}
    )[0]
    assert finish is FinishReason.LENGTH and len(tokens) == 4


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_no_step_is_queued_ahead_of_a_constrained_row(vocabulary, tokenizer, overlap):
    """Its next mask depends on the token being read: the same answer with overlap as without."""
    grammar = vocabulary.json_schema(SHAPES["enum"])
    asked = {0: GenerationRequest((4, 4), 80, HOT, grammar=grammar)}
    with_overlap = run_all(engine_for(tokenizer=tokenizer, overlap=overlap, ahead=3), asked)
    assert with_overlap == run_all(engine_for(tokenizer=tokenizer, overlap=False), asked)
    jsonschema.validate(answer_of(tokenizer, with_overlap[0][0]), SHAPES["enum"])


def test_the_sampler_picks_only_allowed_tokens_and_leaves_unmasked_rows_alone():
    rows, vocab = 3, 70
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
    sampler = RowSampler(rows, vocab, torch.device("cpu"))
    sampler.set(0, GREEDY, masked=True)
    sampler.set(1, HOT, masked=True)
    sampler.set(2, HOT)
    allowed = {0: [3, 64, 69], 1: [1, 2]}
    mask = sampler.allowed_buffer()
    for row, tokens in allowed.items():
        mask[row] = 0
        for token in tokens:
            mask[row, token // 32] |= 1 << (token % 32)
    assert sampler.mode.endswith("+masked")
    expected_free = RowSampler(rows, vocab, torch.device("cpu"))
    expected_free.set(2, HOT)
    for _ in range(20):
        tokens = sampler(logits).tolist()
        assert tokens[0] == max(allowed[0], key=lambda t: logits[0, t])
        assert tokens[1] in allowed[1]
        assert tokens[2] == expected_free(logits).tolist()[2]


def test_allowed_tokens_reads_llguidances_bit_order():
    mask = torch.tensor([[1 - 2**31, 0, 1 << 5]], dtype=torch.int32)  # bits 0 and 31
    assert allowed_tokens(mask, 70).nonzero()[:, 1].tolist() == [0, 31, 69]


def test_a_row_whose_grammar_allows_nothing_fails_alone():
    sampler = RowSampler(2, 40, torch.device("cpu"))
    sampler.set(0, GREEDY, masked=True)
    sampler.allowed_buffer()[0] = 0
    sampler(torch.randn(2, 40))
    assert sampler.failed.tolist() == [True, False] and sampler.tokens[0] == 0


def test_a_grammar_for_another_vocabulary_is_refused_at_join(tokenizer):
    grammar = Vocabulary(tokenizer, 512, (EOS,)).json_schema({"type": "object"})
    engine = engine_for(tokenizer=tokenizer)
    with pytest.raises(
        GenerationInputError, match="vocabulary of 512 tokens, not this package's 320"
    ):
        engine.join(0, GenerationRequest((1,), 5, GREEDY, grammar=grammar))


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "strin"}, "the JSON schema cannot constrain generation: Invalid type: strin"),
        ([1, 2], "the JSON schema must be a JSON object, not list"),
        ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "cannot constrain"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "cannot constrain"),
        ({"enum": ["x" * 70_000]}, "above the 65,536 taken"),
    ],
    ids=["bad-type", "not-an-object", "dangling-ref", "empty-range", "oversized"],
)
def test_a_bad_schema_is_refused_in_one_line(vocabulary, schema, words):
    with pytest.raises(GrammarError, match=words) as raised:
        vocabulary.json_schema(schema)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "pattern",
    ["^(a|b)*a(a|b){400}$", "^(((a|b){30}){30}){30}$"],
    ids=["2**400-states", "27000-repeats"],
)
def test_a_pattern_crafted_to_explode_an_automaton_is_taken_lazily_and_steps(vocabulary, pattern):
    """A pattern whose automaton would have 2**400 states, or 27,000 copies of a part: llguidance
    builds its lexer lazily, each step under LIMITS' fuel, so the schema is taken and each mask
    comes (a step past its fuel would put the matcher in error, never loop)."""
    grammar = vocabulary.json_schema({"type": "string", "pattern": pattern})
    matcher = grammar.matcher()
    mask = torch.zeros(vocabulary.words, dtype=torch.int32)
    for _ in range(40):
        matcher.fill(mask)
        allowed = allowed_tokens(mask[None], VOCAB)[0].nonzero().flatten().tolist()
        assert allowed and not matcher.error
        assert matcher.take(allowed[len(allowed) // 2])


def test_a_schema_nested_past_the_parsers_depth_is_refused(vocabulary):
    nested: dict = {"type": "integer"}
    for _ in range(400):
        nested = {"type": "array", "items": nested}
    with pytest.raises(
        GrammarError, match="the JSON schema is not valid: recursion limit exceeded"
    ):
        vocabulary.json_schema(nested)


def test_one_grammar_serves_many_rows_without_sharing_their_state(vocabulary):
    grammar = vocabulary.json_schema(SHAPES["enum"])
    assert isinstance(grammar, TokenGrammar)
    first, second = grammar.matcher(), grammar.matcher()
    mask = torch.zeros(vocabulary.words, dtype=torch.int32)
    first.fill(mask)
    start = mask.clone()
    allowed = allowed_tokens(start[None], VOCAB)[0].nonzero().flatten().tolist()
    assert first.take(allowed[0])
    second.fill(mask)
    assert torch.equal(mask, start)  # the second is still at the start
