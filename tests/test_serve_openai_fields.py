"""The OpenAI fields of `aotc serve`'s /v1/completions and /v1/chat/completions, each against its
meaning: the completion server's routes (runtime/aotc_runtime/serve/completion_server.py) in-process
through an ASGI test client, no Ray, on GPT-2 from the zoo with the word-level tokenizer ("w7" is
token 7) and a chat template in the same words. Answers are compared with the runtime's own
`generate` and with the package's logits; the protocol's refusals are checked without a server.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import CHATML_WORDS_TEMPLATE, with_chat_template

pytest.importorskip("ray.serve")
from starlette.testclient import TestClient  # noqa: E402
from test_serve_http import asgi, completion_server  # noqa: E402

import aotc_runtime  # noqa: E402
from aotc_runtime.decode_step import pack  # noqa: E402
from aotc_runtime.serve.chat import parse_chat  # noqa: E402
from aotc_runtime.serve.completions import parse_completion  # noqa: E402
from aotc_runtime.serve.protocol import RequestError  # noqa: E402

pytestmark = pytest.mark.slow  # builds the package

PROMPT = [5, 17, 42]


@pytest.fixture(scope="module")
def package(chat_lm):
    return aotc_runtime.load(chat_lm)


@pytest.fixture(scope="module")
def client(chat_lm):
    with TestClient(asgi(completion_server(chat_lm))) as client:
        yield client


def complete(client, path="/v1/completions", **body) -> dict:
    reply = client.post(path, json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def generated(package, prompt, max_tokens, **sampling) -> list:
    """The runtime's own answer for one prompt, alone, cut after an end-of-sequence token."""
    new = package.generate([prompt], max_new_tokens=max_tokens, **sampling)[0, len(prompt) :]
    eos = set(package.manifest.generation.eos_token_ids)
    new = new.tolist()
    ends = [i for i, token in enumerate(new) if token in eos and not sampling.get("ignore_eos")]
    return new[: ends[0] + 1] if ends else new


def chat_prompt(chat_lm, messages) -> list:
    """The prompt transformers' apply_chat_template makes of the messages, with the same template
    and tokenizer."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(chat_lm / "tokenizer.json"), chat_template=CHATML_WORDS_TEMPLATE
    )
    made = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(made["input_ids"] if hasattr(made, "keys") else made)


def test_n_answers_differ_repeat_and_each_is_the_runtimes_with_its_derived_seed(client, package):
    ask = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.5, "seed": 5, "n": 3}
    answer = complete(client, **ask)
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    tokens = [c["token_ids"] for c in choices]
    assert len({tuple(t) for t in tokens}) == 3, tokens  # distinct answers
    assert [c["token_ids"] for c in complete(client, **ask)["choices"]] == tokens  # repeatable
    for j, got in enumerate(tokens):  # answer j draws from seed + j
        assert got == generated(package, PROMPT, 8, temperature=1.5, seed=5 + j)
    single = complete(client, **{**ask, "n": 1})["choices"][0]["token_ids"]
    assert single == tokens[0]
    assert answer["usage"]["prompt_tokens"] == 3
    assert answer["usage"]["completion_tokens"] == sum(map(len, tokens))


def test_a_list_of_prompts_gets_n_answers_each_in_openais_order(client, package):
    prompts = [PROMPT, [7, 8], "w9 w10 w11 w12"]
    answer = complete(client, prompt=prompts, n=2, max_tokens=5, temperature=0)
    choices = answer["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    as_ids = [PROMPT, [7, 8], [9, 10, 11, 12]]
    for i, prompt in enumerate(as_ids):  # prompt i's answers are i * n + j
        expected = generated(package, prompt, 5)
        assert [choices[2 * i + j]["token_ids"] for j in range(2)] == [expected, expected]
        assert choices[2 * i]["text"] == " ".join(f"w{t}" for t in expected)
    usage = answer["usage"]
    assert usage["prompt_tokens"] == 3 + 2 + 4  # each prompt once, not n times
    assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def package_logprobs(package, tokens: list) -> list:
    """The log-softmax of the package's logits after each prefix of `tokens`: one fresh prefill
    of the whole prefix per position (the package's step, row 0)."""
    return [prefill_logprobs(package, tokens[:end]) for end in range(len(PROMPT), len(tokens))]


def prefill_logprobs(package, prefix: list) -> torch.Tensor:
    """The log-softmax of the package's logits after `prefix`, fed to row 0 from position 0."""
    logits = package(*pack([(0, 0, prefix)], package.fixed_picks))
    return torch.log_softmax(logits[0].float(), dim=-1)


def test_logprobs_are_the_log_softmax_of_the_packages_logits(client, package, chat_lm):
    answer = complete(client, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    choice = answer["choices"][0]
    made = choice["token_ids"]
    expected = package_logprobs(package, PROMPT + made)
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f"w{t}" for t in made]
    for position, (token, logprob, top) in enumerate(
        zip(made, logprobs["token_logprobs"], logprobs["top_logprobs"])
    ):
        reference = expected[position]
        assert math.isclose(logprob, float(reference[token]), abs_tol=1e-3)
        values, ids = reference.topk(3)
        wanted = {f"w{i}": float(v) for i, v in zip(ids.tolist(), values)}
        assert set(top) == set(wanted) | {f"w{token}"}  # the sampled token too, as OpenAI's
        for word, value in wanted.items():
            assert math.isclose(top[word], value, abs_tol=1e-3)
    # text offsets: where each token's text starts in the completion's text
    assert logprobs["text_offset"] == [sum(len(f"w{t}") for t in made[:i]) for i in range(5)]
    # chat's shape: the same numbers, with each token's bytes and top_logprobs as a list
    messages = [{"role": "user", "content": "w5 w17 w42"}]
    chat = complete(
        client, "/v1/chat/completions", messages=messages, max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    prompt = chat_prompt(chat_lm, messages)
    content = chat["choices"][0]["logprobs"]["content"]
    made = generated(package, prompt, 4)
    reference = []
    for end in range(len(prompt), len(prompt) + len(made)):
        reference.append(prefill_logprobs(package, (prompt + made)[:end]))
    assert [entry["token"] for entry in content] == [f"w{t}" for t in made]
    for entry, token, expected_row in zip(content, made, reference):
        assert entry["bytes"] == list(f"w{token}".encode())
        assert math.isclose(entry["logprob"], float(expected_row[token]), abs_tol=1e-3)
        values, ids = expected_row.topk(2)
        assert [alt["token"] for alt in entry["top_logprobs"]] == [f"w{i}" for i in ids.tolist()]
        for alt, value in zip(entry["top_logprobs"], values):
            assert math.isclose(alt["logprob"], float(value), abs_tol=1e-3)


def test_echo_returns_the_prompt_and_the_completion(client):
    plain = complete(client, prompt="w5 w17 w42", max_tokens=4, temperature=0)["choices"][0]
    echoed = complete(client, prompt="w5 w17 w42", max_tokens=4, temperature=0, echo=True)
    assert echoed["choices"][0]["text"] == "w5 w17 w42" + plain["text"]
    assert echoed["choices"][0]["token_ids"] == plain["token_ids"]
    by_ids = complete(client, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    assert by_ids["choices"][0]["text"] == "w5 w17 w42" + plain["text"]


def events(client, path: str, body: dict) -> list:
    with client.stream("POST", path, json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        data = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_a_stream_with_include_usage_ends_with_the_usage_and_adds_up_to_the_answer(client):
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.8, "seed": 2, "n": 2}
    whole = complete(client, **body)
    chunks = events(client, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    *tokens, last = chunks
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    assert all(chunk["usage"] is None for chunk in tokens)
    for choice in whole["choices"]:
        mine = [c["choices"][0] for c in tokens if c["choices"][0]["index"] == choice["index"]]
        assert [t for c in mine for t in c["token_ids"]] == choice["token_ids"]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert mine[-1]["finish_reason"] == choice["finish_reason"]
    plain = events(client, "/v1/completions", body)  # without it: no usage chunk
    assert "usage" not in plain[-1] and plain[-1]["choices"]


def test_stop_as_a_string_or_a_list_ends_the_text_before_it(client):
    ask = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    words = complete(client, **ask)["choices"][0]["text"].split()
    at = next(i for i in range(1, len(words)) if words[i] not in words[:i])
    for stop in (" " + words[at], ["w0 never", " " + words[at]]):
        choice = complete(client, **ask, stop=stop)["choices"][0]
        assert choice["text"] == " ".join(words[:at]) and choice["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "fields",
    [
        {"repetition_penalty": 1.8},
        {"presence_penalty": 1.5, "frequency_penalty": 0.5},
        {"temperature": 1.2, "seed": 4, "min_p": 0.2, "top_k": 40},
    ],
)
def test_penalties_min_p_and_top_k_are_the_runtimes(client, package, fields):
    http = {"temperature": 0, **fields}
    answer = complete(client, prompt=PROMPT, max_tokens=10, **http)
    assert answer["choices"][0]["token_ids"] == generated(package, PROMPT, 10, **http)


def test_ignore_eos_goes_on_to_max_tokens(generation_packages, tmp_path):
    """A copy of the package whose end-of-sequence id is the third greedy token: the answer stops
    there, and with ignore_eos goes on to max_tokens, as the runtime's does."""
    plain = generation_packages.with_tokenizer()[0]
    first = aotc_runtime.load(plain).generate([PROMPT], max_new_tokens=3)[0, -1].item()
    chat_lm = with_chat_template(plain, tmp_path / "eos_pkg", eos=[first])
    with TestClient(asgi(completion_server(chat_lm))) as client:
        ask = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        stopped = complete(client, **ask)["choices"][0]
        assert stopped["finish_reason"] == "stop" and stopped["token_ids"][-1] == first
        assert len(stopped["token_ids"]) <= 3
        going = complete(client, **ask, ignore_eos=True)["choices"][0]
        assert going["finish_reason"] == "length" and len(going["token_ids"]) == 8
        expected = aotc_runtime.load(chat_lm).generate([PROMPT], max_new_tokens=8, ignore_eos=True)
        assert going["token_ids"] == expected[0, 3:].tolist()


def test_chat_answers_as_the_runtime_on_transformers_prompt_plain_and_streamed(
    client, package, chat_lm
):
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client)
    messages = [
        {"role": "system", "content": "w30 w31"},
        {"role": "user", "content": "w5 w17 w42"},
    ]
    prompt = chat_prompt(chat_lm, messages)
    expected = generated(package, prompt, 6)
    answer = api.chat.completions.create(
        model="chat_pkg", messages=messages, max_completion_tokens=6, temperature=0
    )
    assert answer.object == "chat.completion" and answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == " ".join(f"w{t}" for t in expected)
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.completion_tokens == len(expected)
    stream = api.chat.completions.create(
        model="chat_pkg", messages=messages, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer.choices[0].message.content
    assert chunks[-1].usage.total_tokens == len(prompt) + len(expected)
    # without max_tokens, the answer may fill what the cache holds after the prompt
    room = complete(
        client, "/v1/chat/completions", messages=messages, temperature=0, ignore_eos=True
    )
    assert room["usage"]["total_tokens"] == package.generation.max_seq_len


def test_chat_refusals_reach_the_openai_client_as_one_line(client, generation_packages):
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client)
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="chat_pkg", messages=[{"role": "user", "content": "w5"}], top_logprobs=2
        )
    assert caught.value.body["message"] == (
        "'top_logprobs' needs \"logprobs\": true; send both, or leave it out"
    )
    # a package without a chat template
    plain = generation_packages.with_tokenizer()[0]
    with TestClient(asgi(completion_server(plain))) as other:
        api = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=other)
        with pytest.raises(openai.BadRequestError) as caught:
            api.chat.completions.create(
                model=plain.name, messages=[{"role": "user", "content": "w5"}]
            )
    assert caught.value.body["message"].startswith("this package carries no chat template")
    assert "aotc export MODEL_DIR --task text-generation" in caught.value.body["message"]


# The protocol alone: refusals of the new fields, without a server.
GENERATION = aotc_runtime.Generation(batch_size=4, max_seq_len=32, vocab_size=512)


@pytest.fixture(scope="module")
def template():
    from aotc_runtime.chat_template import ChatTemplate

    return ChatTemplate(CHATML_WORDS_TEMPLATE)


@pytest.mark.parametrize(
    "data, param, words",
    [
        ({"prompt": "w1", "echo": True, "logprobs": 1}, "echo", "'echo' with 'logprobs' asks"),
        ({"prompt": [1], "echo": True}, "echo", "this package carries no tokenizer"),
        ({"prompt": "w1", "stream_options": {"include_usage": True}}, "stream_options", "only with"),
        ({"prompt": "w1", "stream": True, "stream_options": {"x": 1}}, "stream_options", "must be"),
        ({"prompt": "w1", "logprobs": 21}, "logprobs", "'logprobs' must be a whole number from 0 to 20"),
        ({"prompt": "w1", "n": 129}, "n", "'n' must be a whole number from 1 to 128"),
        ({"prompt": ["w1"] * 20, "n": 8}, "n", "ask for 160 answers; send at most 128"),
        ({"prompt": [[1], []]}, "prompt", "the prompt is empty"),
        ({"prompt": [[1], [1, 999]]}, "prompt", "token id 999 is outside the vocabulary"),
        ({"prompt": "w1", "presence_penalty": 3}, "presence_penalty", "'presence_penalty': "),
        ({"prompt": "w1", "repetition_penalty": 0}, "repetition_penalty", "'repetition_penalty': "),
        ({"prompt": "w1", "min_p": 1.5}, "min_p", "'min_p': "),
        ({"prompt": "w1", "ignore_eos": 1}, "ignore_eos", "'ignore_eos' must be true or false"),
        ({"prompt": "w1", "logit_bias": {"5": 1}}, "logit_bias", "supports only {}"),
    ],
)  # fmt: skip
def test_completion_field_refusals_name_the_field(tokenizer, data, param, words):
    uses_text = not (isinstance(data["prompt"], list) and data.get("echo"))
    with pytest.raises(RequestError) as caught:
        parse_completion(json.dumps(data).encode(), GENERATION, tokenizer if uses_text else None)
    assert caught.value.status == 400 and caught.value.param == param, caught.value
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "messages, words",
    [
        ([], "'messages' must be a non-empty list"),
        ([{"role": "user", "content": "w1", "function_call": {}}], "message 0 has 'function_call'"),
        ([{"role": "user", "content": "w1", "k" * 70: 1}], "message 0 has a name of 70 characters"),
        (
            [{"role": "user", "content": [{"type": "image_url"}]}],
            'content part of type "image_url"',
        ),
        ([{"role": "user", "content": 5}], "message 0's 'content' is 5"),
        ([{"role": "robot", "content": "w1"}], "refuses these messages"),  # the template's own
    ],
)
def test_chat_message_refusals_name_the_message(tokenizer, template, messages, words):
    with pytest.raises(RequestError) as caught:
        parse_chat(json.dumps({"messages": messages}).encode(), GENERATION, tokenizer, template)
    assert caught.value.status == 400 and caught.value.param == "messages"
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_long_value_is_described_whole_in_its_refusal(tokenizer, template):
    """A value too long to quote is named by what it is, never cut mid-value."""
    functions = [{"name": "get_weather", "parameters": {"type": "object", "properties": {}}}]
    body = {"messages": [{"role": "user", "content": "w1"}], "functions": functions}
    with pytest.raises(RequestError) as caught:
        parse_chat(json.dumps(body).encode(), GENERATION, tokenizer, template)
    assert str(caught.value) == (
        "'functions' is a list of 1 item; this server supports only [] (leave it out)"
    ), str(caught.value)


def test_chat_reads_text_parts_and_both_max_token_names(tokenizer, template):
    parts = [{"type": "text", "text": "w5 "}, {"type": "text", "text": "w6"}]
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 3}
    request = parse_chat(json.dumps(body).encode(), GENERATION, tokenizer, template)
    assert list(request.prompt_ids) == [1, 5, 6, 4, 2] and request.decoding.max_tokens == 3
    body = {**body, "max_completion_tokens": 5}
    assert (
        parse_chat(json.dumps(body).encode(), GENERATION, tokenizer, template).decoding.max_tokens
        == 5
    )
    del body["max_tokens"], body["max_completion_tokens"]
    room = parse_chat(
        json.dumps(body).encode(), GENERATION, tokenizer, template
    ).decoding.max_tokens
    assert room == 32 - 5  # what the cache holds after the prompt


def test_unseeded_sampled_answers_each_draw_a_fresh_seed(tokenizer):
    """As OpenAI's: without a seed, sampled answers differ request to request (the runtime's
    default seed would give them all the same text); greedy answers need none."""
    body = json.dumps({"prompt": [1], "temperature": 0.8, "n": 2}).encode()
    seeds = [c.request.sampling.seed for c in parse_completion(body, GENERATION).choices]
    assert None not in seeds and seeds[0] != seeds[1]
    again = [c.request.sampling.seed for c in parse_completion(body, GENERATION).choices]
    assert again != seeds
    greedy = json.dumps({"prompt": [1], "temperature": 0, "n": 2}).encode()
    assert [c.request.sampling.seed for c in parse_completion(greedy, GENERATION).choices] == [
        None,
        None,
    ]
