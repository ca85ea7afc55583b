"""The OpenAI completions protocol of `aotc serve` (runtime/aotc_runtime/serve/completions.py),
without a server: what a request may say, the one-line 4xx of each refusal, and the shape of answers
and events."""

from __future__ import annotations

import dataclasses
import json

import pytest

from aotc_runtime import Generation
from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.sampling import Sampling
from aotc_runtime.serve.completions import DONE_EVENT, max_body_bytes, parse_completion, sse_event
from aotc_runtime.serve.protocol import RequestError
from aotc_runtime.text_delta import cut_at_stop

GENERATION = Generation(batch_size=4, max_seq_len=32, vocab_size=512)


def parse(data, tokenizer=None):
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    return parse_completion(body, GENERATION, tokenizer)


def test_a_request_with_ids_takes_openais_max_tokens_and_the_models_sampling():
    """max_tokens 16 as OpenAI documents; the sampling the request leaves out is the model's
    (greedy for a record without defaults, as transformers' `generate`; a model that samples at
    temperature 1.0 gets OpenAI's own default)."""
    request = parse({"prompt": [5, 17, 42], "model": "lm"})
    decoding = request.decoding
    assert request.prompt_ids == [5, 17, 42] and decoding.model == "lm"
    assert decoding.max_tokens == 16 and decoding.stop == () and decoding.stream is False
    assert decoding.sampling == Sampling(temperature=0.0, top_k=None, top_p=None, seed=None)
    sampling = dataclasses.replace(GENERATION, sampling_defaults={"temperature": 1.0})
    body = json.dumps({"prompt": [5, 17, 42]}).encode()
    assert parse_completion(body, sampling).decoding.sampling == Sampling(temperature=1.0)


def test_text_is_tokenized_and_stop_strings_need_the_tokenizer(tokenizer):
    request = parse({"prompt": "w5 w17", "stop": ["w9"], "temperature": 0}, tokenizer)
    assert request.prompt_ids == tokenizer.encode("w5 w17").ids
    assert request.decoding.stop == ("w9",) and request.decoding.sampling.temperature == 0.0


def test_fields_a_client_always_sends_are_accepted_at_their_neutral_value():
    request = parse({"prompt": [1], "n": 1, "echo": False, "logprobs": None, "stream": True})
    assert request.decoding.stream is True


@pytest.mark.parametrize(
    "data, status, words",
    [
        (b"{not json", 400, "not JSON"),
        (b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "nests too deeply"),
        (b"[1, 2]", 400, "not a JSON object"),
        ({"max_tokens": 4}, 400, "'prompt' is missing"),
        ({"prompt": [1], "bogus": 1}, 400, "unknown field 'bogus'"),
        ({"prompt": [1], "best_of": 2}, 400, "'best_of' is 2; this server supports only 1"),
        # a value or name too long to quote is described, never cut mid-value
        (
            {"prompt": [1], "logit_bias": {str(token): -100 for token in range(50, 70)}},
            400,
            "'logit_bias' is an object of 20 keys; this server supports only {} (leave it out)",
        ),
        ({"prompt": [1], "x" * 61: 1}, 400, "unknown field a name of 61 characters; a completion"),
        # the runtime's range checks quote a value whole: a long one is described there too
        (
            {"prompt": [1], "temperature": "hot" * 40},
            400,
            "'temperature': temperature a string of 120 characters is outside the accepted values",
        ),
        (
            {"prompt": [1], "top_p": [0.5] * 30},
            400,
            "'top_p': top-p a list of 30 items is outside [1e-06, 1]",
        ),
        ({"prompt": [1], "seed": 10**70}, 400, "'seed': seed a number of 71 digits is not a whole"),
        ({"prompt": [1], "temperature": "hot"}, 400, "'temperature': temperature 'hot' is outside"),
        ({"prompt": [1], "n": 0}, 400, "'n' must be a whole number from 1 to 128"),
        ({"prompt": [1], "max_tokens": "8"}, 400, "'max_tokens' must be a whole number >= 1"),
        ({"prompt": [1], "max_tokens": 0}, 400, "'max_tokens' must be a whole number >= 1"),
        ({"prompt": [1], "temperature": -1}, 400, "'temperature': temperature -1 is outside"),
        ({"prompt": [1], "top_p": 0}, 400, "'top_p': top-p 0 is outside [1e-06, 1]"),
        ({"prompt": [1], "stream": "yes"}, 400, "'stream' must be true or false"),
        ({"prompt": [1], "seed": -3}, 400, "'seed': seed -3 is not a whole number from 0"),
        ({"prompt": []}, 400, "the prompt is empty"),
        ({"prompt": [5, 600]}, 400, "token id 600 is outside the vocabulary (0..511)"),
        ({"prompt": [1, True]}, 400, "'prompt' must be text, a list of token ids, or a list of"),
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
    import asyncio

    from aotc_runtime.serve.answers import server_sent, whole_answer
    from aotc_runtime.serve.completions import CompletionShape

    request = parse({"prompt": [1, 2, 3], "max_tokens": 2})
    made = [  # the engine's events, as completion_engine passes them on
        {"index": 0, "token_ids": [4], "text": "a\nb", "finish_reason": None},
        {"index": 0, "token_ids": [5], "text": "c", "finish_reason": FinishReason.LENGTH},
    ]

    async def events():
        yield {"events": made}

    async def collect():
        whole = await whole_answer(events(), request, CompletionShape(request, None), "lm")
        chunks = [
            c async for c in server_sent(events(), request, CompletionShape(request, None), "lm")
        ]
        return whole, chunks

    body, chunks = asyncio.run(collect())
    assert body["object"] == "text_completion" and body["choices"][0]["token_ids"] == [4, 5]
    assert body["choices"][0]["text"] == "a\nbc" and body["choices"][0]["finish_reason"] == "length"
    assert '"finish_reason": "length"' in json.dumps(body)  # as ingress.json_response writes it
    assert b'"finish_reason":"length"' in chunks[0] and b"FinishReason" not in b"".join(chunks)
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    event = chunks[0].split(b"\n\n")[0] + b"\n\n"
    assert event.startswith(b"data: ") and event.count(b"\n") == 2
    assert json.loads(event[6:])["choices"][0]["text"] == "a\nb"
    assert chunks[-1] == DONE_EVENT == b"data: [DONE]\n\n"
    assert sse_event({"a": 1}) == b'data: {"a":1}\n\n'


@pytest.mark.parametrize(
    "field, value, words",
    [
        # each passed parsing and reached the package: the client got 500 "the model failed"
        ("temperature", 1e-39, "temperature 1e-39 is outside the accepted values: 0 for greedy"),
        ("top_p", 1e-46, "top-p 1e-46 is outside [1e-06, 1]"),
        ("seed", 2**64, f"seed {2**64} is not a whole number from 0 to 2**64-1"),
        ("temperature", 100.5, "temperature 100.5 is outside the accepted values"),
        ("temperature", True, "temperature True is outside"),  # a boolean is not a number
        ("top_p", "0.5", "top-p '0.5' is outside"),
        ("seed", 1.0, "seed 1.0 is not a whole number"),
        ("top_k", 0, "top-k 0 is not a whole number from 1 to 2147483647"),
        ("top_k", 2.7, "top-k 2.7 is not a whole number"),
        ("top_k", True, "top-k True is not a whole number"),
    ],
)
def test_sampling_values_outside_the_runtimes_ranges_are_400_naming_the_field(field, value, words):
    with pytest.raises(RequestError) as caught:
        parse({"prompt": [1], field: value})
    assert caught.value.status == 400 and caught.value.param == field
    assert str(caught.value).startswith(f"'{field}': ")
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_sampling_accepts_exactly_the_runtimes_ranges():
    """aotc_runtime.sampling's bounds, the same as `aotc generate` and the C++ runner: above
    OpenAI's temperature cap of 2 too."""
    from aotc_runtime.sampling import MAX_SEED, MAX_TEMPERATURE, MIN_TEMPERATURE, MIN_TOP_P

    def sampling(**fields):
        return parse({"prompt": [1], **fields}).decoding.sampling

    for temperature in (0, MIN_TEMPERATURE, 2.5, MAX_TEMPERATURE):
        assert sampling(temperature=temperature).temperature == temperature
    assert sampling(top_p=MIN_TOP_P).top_p == MIN_TOP_P
    assert sampling(seed=MAX_SEED).seed == MAX_SEED


def test_top_k_reaches_the_runtime_as_the_cli_gives_it():
    request = parse({"prompt": [1], "temperature": 0.7, "top_k": 50})
    assert request.decoding.sampling.top_k == 50 and request.choices[0].request.sampling.top_k == 50
    assert parse({"prompt": [1]}).decoding.sampling.top_k is None


def test_an_explicit_null_means_the_fields_default(tokenizer):
    nulls = dict.fromkeys(
        ["max_tokens", "temperature", "top_p", "seed", "stop", "stream", "user", "model", "n",
         "best_of", "echo", "presence_penalty", "frequency_penalty", "suffix"]
    )  # fmt: skip
    decoding = parse({"prompt": "w5", **nulls}, tokenizer).decoding
    assert decoding.max_tokens == 16 and decoding.sampling == Sampling()  # the model's: greedy
    assert (decoding.stop, decoding.stream, decoding.model, decoding.n) == ((), False, None, 1)


@pytest.mark.parametrize(
    "data, words",
    [
        # torch could not hold the id: a plain-text 500 and a traceback in the replica's log
        (b'{"prompt": [5, 99999999999999999999]}', "token id 99999999999999999999 is outside the vocabulary (0..511)"),
        (b'{"prompt": [5, -99999999999999999999]}', "token id -99999999999999999999 is outside the vocabulary"),
    ],
)  # fmt: skip
def test_a_token_id_beyond_int64_is_400(data, words):
    with pytest.raises(RequestError) as caught:
        parse(data)
    assert caught.value.status == 400 and caught.value.param == "prompt"
    assert str(caught.value) == words or words in str(caught.value), str(caught.value)


@pytest.mark.parametrize("field", ["prompt", "stop"])
def test_a_lone_surrogate_in_text_is_400(tokenizer, field):
    """JSON's "\\ud800" is no character: the tokenizer raised on it (a plain-text 500)."""
    body = {"prompt": "w5", field: "w5 \ud800"}
    with pytest.raises(RequestError) as caught:
        parse(json.dumps(body).encode(), tokenizer)
    assert caught.value.status == 400 and caught.value.param == field
    assert str(caught.value) == (
        f"'{field}' holds a lone UTF-16 surrogate (\"\\ud800\" at character 3), which is not "
        "text; send valid Unicode (a surrogate pair, or UTF-8)"
    )


def test_the_413_names_the_prompt_limit_and_its_real_fix():
    """The body limit of a completion comes from the package's cache: --max-body-mb cannot raise it."""
    with pytest.raises(RequestError) as caught:
        parse(b" " * (max_body_bytes(32) + 1))
    assert caught.value.status == 413
    assert str(caught.value) == (
        f"request body is {max_body_bytes(32) + 1} bytes, above the {max_body_bytes(32)} a prompt "
        "of at most 32 tokens (this package's cache) needs; send a shorter prompt, or serve a "
        "package exported with a larger --max-seq-len"
    )


def test_errors_have_openais_shape():
    from aotc_runtime.serve.protocol import error_body

    with pytest.raises(RequestError) as caught:
        parse({"prompt": [1], "top_p": 2})
    assert caught.value.body() == {
        "error": {
            "message": "'top_p': top-p 2 is outside [1e-06, 1]",
            "type": "invalid_request_error",
            "param": "top_p",
            "code": None,
        }
    }
    assert error_body(500, "the model failed:\n  detail") == {
        "error": {
            "message": "the model failed: detail",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
