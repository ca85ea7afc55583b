"""The OpenAI completions protocol of `aotc serve` (aotc/serve/completions.py), without a server:
what a request may say, the one-line 4xx of each refusal, and the shape of answers and events."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_tokenizer

from aotc.serve.completions import (
    DONE_EVENT,
    chunk_body,
    completion_body,
    cut_at_stop,
    max_body_bytes,
    parse_completion,
    sse_event,
)
from aotc.serve.protocol import RequestError
from aotc_runtime import Generation

GENERATION = Generation(batch_size=4, max_seq_len=32, vocab_size=512)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer

    folder = tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def parse(data, tokenizer=None):
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    return parse_completion(body, GENERATION, tokenizer)


def test_a_request_with_ids_and_the_defaults_openai_documents():
    request = parse({"prompt": [5, 17, 42], "model": "lm"})
    assert request.prompt_ids == [5, 17, 42] and request.model == "lm"
    assert (request.max_tokens, request.temperature, request.top_p) == (16, 1.0, 1.0)
    assert request.seed is None and request.stop == () and request.stream is False
    assert request.sampling() == {"temperature": 1.0, "top_p": None, "seed": None}


def test_text_is_tokenized_and_stop_strings_need_the_tokenizer(tokenizer):
    request = parse({"prompt": "w5 w17", "stop": ["w9"], "temperature": 0}, tokenizer)
    assert request.prompt_ids == tokenizer.encode("w5 w17").ids and request.stop == ("w9",)
    assert request.sampling()["temperature"] == 0.0


def test_fields_a_client_always_sends_are_accepted_at_their_neutral_value():
    request = parse({"prompt": [1], "n": 1, "echo": False, "logprobs": None, "stream": True})
    assert request.stream is True


@pytest.mark.parametrize(
    "data, status, words",
    [
        (b"{not json", 400, "not JSON"),
        (b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nests too deeply"),
        (b"[1, 2]", 400, "not a JSON object"),
        ({"max_tokens": 4}, 400, "'prompt' is missing"),
        ({"prompt": [1], "bogus": 1}, 400, "unknown field 'bogus'"),
        ({"prompt": [1], "n": 2}, 400, "'n' is 2; this server supports only 1"),
        ({"prompt": [1], "max_tokens": "8"}, 400, "'max_tokens' must be a whole number >= 1"),
        ({"prompt": [1], "max_tokens": 0}, 400, "'max_tokens' must be a whole number >= 1"),
        ({"prompt": [1], "temperature": -1}, 400, "'temperature' must be a number in [0, 2]"),
        ({"prompt": [1], "top_p": 0}, 400, "'top_p' must be a number in (0, 1]"),
        ({"prompt": [1], "stream": "yes"}, 400, "'stream' must be true or false"),
        ({"prompt": [1], "seed": -3}, 400, "'seed' must be a whole number >= 0"),
        ({"prompt": []}, 400, "the prompt is empty"),
        ({"prompt": [5, 600]}, 400, "token id 600 is outside the vocabulary (0..511)"),
        ({"prompt": [1, True]}, 400, "'prompt' must be text or a list of token ids"),
        ({"prompt": "hello"}, 400, "carries no tokenizer"),
        ({"prompt": [1], "stop": "x"}, 400, "'stop' needs text"),
        ({"prompt": [1] * 20, "max_tokens": 16}, 400, "KV cache holds 32"),
        (b" " * (max_body_bytes(32) + 1), 413, "send a shorter prompt"),
    ],
)
def test_each_bad_request_gets_its_status_and_one_line(data, status, words):
    with pytest.raises(RequestError) as caught:
        parse(data)
    assert caught.value.status == status
    message = str(caught.value)
    assert words in message and "\n" not in message, message


def test_too_many_stop_strings_are_refused(tokenizer):
    with pytest.raises(RequestError, match="send at most 4"):
        parse({"prompt": "w1", "stop": ["a", "b", "c", "d", "e"]}, tokenizer)


def test_stop_cuts_the_text_before_the_first_stop_string():
    assert cut_at_stop("one two three", ("three", "two")) == ("one ", True)
    assert cut_at_stop("one two", ("four",)) == ("one two", False)


def test_answers_and_events_have_openais_shape():
    body = completion_body("cmpl-1", "lm", 7, "hi", [4, 5], "length", prompt_tokens=3)
    assert body["object"] == "text_completion" and body["choices"][0]["token_ids"] == [4, 5]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    event = sse_event(chunk_body("cmpl-1", "lm", 7, "a\nb", [4]))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert json.loads(event[6:])["choices"][0]["text"] == "a\nb"
    assert DONE_EVENT == b"data: [DONE]\n\n"
