"""A request is checked once, by the rule's one owner, whichever front end made it.

The rules that had two or three owners, each test showing the one left refuses what they all did:
- a sampling value's range: a Sampling checks itself when it is made (InvalidSampling, naming its
  field), where serve's fields checked each value again through a Sampling of its own and
  GenerationRequest.check checked the Sampling a third time;
- a prompt's room in the KV cache: GenerationRequest.check (check_room), where the decode engine's
  `fits` and the serve's admission asked again;
- the sampling fields' names: Sampling's, read by the HTTP endpoints and the CLI's options, where
  each wrote its own list.
Nothing here compiles a model: the engine runs tests/fake_generation.py's package."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fake_generation import FakeGeneration

from aotc.cli.chat import chat
from aotc.cli.generate import generate
from aotc_runtime import Generation, generation_request
from aotc_runtime.decode_engine import DecodeEngine
from aotc_runtime.errors import GenerationInputError
from aotc_runtime.generation_request import GenerationRequest
from aotc_runtime.sampling_settings import SAMPLING_FIELDS, InvalidSampling, Sampling
from aotc_runtime.serve import chat as chat_endpoint
from aotc_runtime.serve import completions
from aotc_runtime.serve.completions import parse_completion
from aotc_runtime.serve.protocol import RequestError

GENERATION = Generation(batch_size=2, max_seq_len=32, vocab_size=128)

# one value past each range, and the runtime's words for it
OUT_OF_RANGE = {
    "temperature": (0.001, "temperature 0.001 is outside the accepted values"),
    "top_k": (0, "top-k 0 is not a whole number from 1"),
    "top_p": (1.5, "top-p 1.5 is outside [1e-06, 1]"),
    "seed": (-1, "seed -1 is not a whole number from 0 to 2**64-1"),
    "min_p": (2, "min-p 2 is outside [0, 1]"),
    "presence_penalty": (3, "presence penalty 3 is outside [-2, 2]"),
    "frequency_penalty": (-2.5, "frequency penalty -2.5 is outside [-2, 2]"),
    "repetition_penalty": (0, "repetition penalty 0 is outside [0.01, 100]"),
}


def completion(**fields):
    return parse_completion(json.dumps({"prompt": [1, 2], **fields}).encode(), GENERATION)


def test_every_sampling_field_has_a_bound_tested_here():
    assert set(OUT_OF_RANGE) == set(SAMPLING_FIELDS)


@pytest.mark.parametrize("field", OUT_OF_RANGE)
def test_a_sampling_value_out_of_range_cannot_be_made_and_http_refuses_it_in_the_same_words(
    field,
):
    value, words = OUT_OF_RANGE[field]
    with pytest.raises(InvalidSampling) as made:
        Sampling(**{"temperature": 1.0, field: value})
    assert made.value.field == field and str(made.value).startswith(words)
    assert isinstance(made.value, GenerationInputError)  # the Python API's error, exit 2
    with pytest.raises(RequestError) as refused:
        completion(**{"temperature": 1.0, field: value})
    assert refused.value.status == 400 and refused.value.param == field
    assert str(refused.value) == f"'{field}': {made.value}"


def test_a_whole_number_for_a_float_setting_is_held_as_that_float():
    sampling = Sampling(temperature=1, top_p=1, repetition_penalty=2)
    assert [type(v) for v in (sampling.temperature, sampling.top_p)] == [float, float]
    assert sampling == Sampling(temperature=1.0, top_p=1.0, repetition_penalty=2.0)
    assert completion(temperature=1).decoding.sampling.temperature == 1.0


def test_the_room_in_the_cache_is_the_requests_check_and_it_is_made_once(monkeypatch):
    """A parsed request was checked against the package; the engine's join does not check it
    again, and a request no one checked is checked at join, in the same words."""
    calls = []
    owner = generation_request.check_room

    def counted(*args):
        calls.append(args)
        return owner(*args)

    monkeypatch.setattr(generation_request, "check_room", counted)
    fake = FakeGeneration(batch_size=2, max_seq_len=32)
    parsed = parse_completion(
        json.dumps({"prompt": [1, 2, 3], "max_tokens": 29}).encode(), fake.generation
    )
    assert len(calls) == 1
    engine = DecodeEngine(fake)
    engine.join("parsed", parsed.choices[0].request)
    assert len(calls) == 1, "the engine checked a checked request again"
    with pytest.raises(RequestError) as refused:
        parse_completion(
            json.dumps({"prompt": [1, 2, 3], "max_tokens": 30}).encode(), fake.generation
        )
    assert refused.value.param == "max_tokens"
    with pytest.raises(GenerationInputError) as joined:
        engine.join("unchecked", GenerationRequest((1, 2, 3), 30))
    assert str(joined.value) == str(refused.value)
    assert "need 33 positions, but the package's KV cache holds 32" in str(joined.value)
    engine.release()


def test_a_request_that_fits_the_cache_joins_whenever_a_row_is_free():
    """The engine asks one thing before a join: a free row."""
    fake = FakeGeneration(batch_size=2, max_seq_len=32)
    engine = DecodeEngine(fake)
    engine.join("a", GenerationRequest((1,), 31))  # a whole row
    assert engine.has_free_row
    engine.join("b", GenerationRequest((1,) * 31, 1))
    assert not engine.has_free_row
    with pytest.raises(ValueError, match="every row of the batch is taken"):
        engine.join("c", GenerationRequest((1,), 1))
    engine.release()


def test_a_request_invalid_in_itself_cannot_be_made():
    for prompt, words in (((), "the prompt is empty"), ((1, -2), "token id -2 is outside"),
                          ((1, True), "token id True is outside")):  # fmt: skip
        with pytest.raises(GenerationInputError, match=words):
            GenerationRequest(prompt, 4)
    with pytest.raises(GenerationInputError, match="max_new_tokens is 0"):
        GenerationRequest((1,), 0)
    with pytest.raises(GenerationInputError, match="logprobs 21 is not a whole number"):
        GenerationRequest((1,), 1, logprobs=21)
    with pytest.raises(GenerationInputError, match="sampling is a dict"):
        GenerationRequest((1,), 1, {"temperature": 1.0})  # type: ignore[arg-type]


def test_a_checked_request_is_checked_again_for_another_package():
    small = dataclasses.replace(GENERATION, vocab_size=8)
    request = GenerationRequest((1, 9), 2).check(GENERATION)
    with pytest.raises(
        GenerationInputError, match=r"token id 9 is outside the vocabulary \(0..7\)"
    ):
        request.check(small)


def test_the_sampling_fields_have_one_list_the_endpoints_and_the_cli_read():
    for fields in (completions.FIELDS, chat_endpoint.FIELDS):
        assert set(SAMPLING_FIELDS) <= set(fields)
        assert len(fields) == len(set(fields))
    for command in (generate, chat):
        names = {param.name for param in command.params}
        assert set(SAMPLING_FIELDS) <= names, command.name


def test_the_chats_logprobs_reach_its_answers_requests_from_one_decoding(tokenizer):
    """The endpoint's own fields (chat's logprobs and top_logprobs) are part of the one Decoding
    it reads, which every answer's GenerationRequest is made from."""
    from conftest import CHATML_WORDS_TEMPLATE

    from aotc_runtime.chat_template import ChatTemplate

    generation = dataclasses.replace(GENERATION, vocab_size=512)
    template = ChatTemplate(CHATML_WORDS_TEMPLATE)
    body = {"messages": [{"role": "user", "content": "w5"}], "logprobs": True,
            "top_logprobs": 3, "n": 2, "max_tokens": 4, "temperature": 0.5, "seed": 9}  # fmt: skip
    parsed = chat_endpoint.parse_chat(json.dumps(body).encode(), generation, tokenizer, template)
    assert parsed.decoding.logprobs == 3
    asked = [choice.request for choice in parsed.choices]
    assert [r.logprobs for r in asked] == [3, 3]
    assert [r.sampling.seed for r in asked] == [9, 10]
    assert {r.sampling.temperature for r in asked} == {0.5}
