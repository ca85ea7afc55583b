"""`aotc serve` of a text-generation package with a chat template, end to end on a local Ray over
loopback: /v1/chat/completions through the official `openai` client and through LangChain
(`ChatOpenAI`, and its legacy `OpenAI` LLM, which sends a list of prompts), each answer against
the runtime's own `generate` on the prompt transformers' `apply_chat_template` makes; the server
says it is ready only once its routes answer, and stops without Ray's shutdown noise.

One server for the module (one Ray start-up). The field-by-field checks run without Ray in
test_serve_openai_fields.py.
"""

from __future__ import annotations

import json

import pytest
from conftest import free_port, invoke
from test_serve_openai_fields import PROMPT, chat_prompt, generated

pytest.importorskip("ray.serve")

import aotc_runtime  # noqa: E402
from aotc_runtime.serve.app import ServeOptions, _ask, start, stop  # noqa: E402

pytestmark = pytest.mark.slow
TIMEOUT_S = 60
MESSAGES = [{"role": "user", "content": "w5 w17 w42"}]


@pytest.fixture(scope="module")
def package(chat_lm):
    return aotc_runtime.load(chat_lm)


@pytest.fixture(scope="module")
def server(chat_lm):
    import ray

    running = start(ServeOptions(package=chat_lm, port=free_port()))
    yield running
    if ray.is_initialized():  # the last test stops it itself
        stop(running)


@pytest.fixture
def no_tiktoken(monkeypatch):
    """LangChain counts tokens with tiktoken, whose encodings download on first use: any use
    fails the test instead (CI has no network, and the server counts the tokens)."""
    tiktoken = pytest.importorskip("tiktoken")

    def refuse(*_args, **_kwargs):
        raise AssertionError("tiktoken was asked for an encoding (it would download it)")

    monkeypatch.setattr(tiktoken, "get_encoding", refuse)
    monkeypatch.setattr(tiktoken, "encoding_for_model", refuse)


def test_every_route_answers_as_soon_as_the_server_is_ready(server):
    assert server.health["status"] == "ok"
    endpoints = server.metadata["endpoints"]
    assert "POST /v1/chat/completions" in endpoints and "POST /v1/completions" in endpoints
    for endpoint in endpoints:  # aotc's JSON, not Ray's proxy's 404 "Path ... not found"
        status, body = _ask(server.url, endpoint)
        assert body is not None and status in (200, 400), (endpoint, status)


def test_the_openai_client_chats_plain_and_streamed(server, package, chat_lm):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=TIMEOUT_S)
    expected = generated(package, chat_prompt(chat_lm, MESSAGES), 6)
    text = " ".join(f"w{t}" for t in expected)
    answer = client.chat.completions.create(
        model="chat_pkg", messages=MESSAGES, max_tokens=6, temperature=0
    )
    assert answer.choices[0].message.content == text
    assert answer.usage.completion_tokens == len(expected)
    streamed = client.chat.completions.create(
        model="chat_pkg", messages=MESSAGES, max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == text
    with pytest.raises(openai.BadRequestError) as caught:  # the message reaches the client
        client.chat.completions.create(model="chat_pkg", messages=[], max_tokens=2)
    assert caught.value.body["message"].startswith("'messages' must be a non-empty list")


def test_langchain_chat_and_its_legacy_llm_with_a_list_of_prompts(
    server, package, chat_lm, no_tiktoken
):
    langchain_openai = pytest.importorskip("langchain_openai")
    common = {"base_url": f"{server.url}/v1", "api_key": "unused", "model": "chat_pkg",
              "temperature": 0, "max_tokens": 5, "timeout": TIMEOUT_S}  # fmt: skip
    chat = langchain_openai.ChatOpenAI(**common)
    expected = " ".join(f"w{t}" for t in generated(package, chat_prompt(chat_lm, MESSAGES), 5))
    assert chat.invoke(MESSAGES[0]["content"]).content == expected
    assert "".join(chunk.content for chunk in chat.stream(MESSAGES[0]["content"])) == expected
    llm = langchain_openai.OpenAI(**common)
    prompts = ["w5 w17 w42", "w7 w8"]
    result = llm.generate(prompts)  # one request: {"prompt": [...two prompts...]}
    for prompt, generations in zip([PROMPT, [7, 8]], result.generations):
        assert generations[0].text == " ".join(f"w{t}" for t in generated(package, prompt, 5))
    assert result.llm_output["token_usage"]["prompt_tokens"] == 5


def test_serve_help_lists_the_routes_of_each_kind_of_package():
    result = invoke("serve", "--help")
    assert result.exit_code == 0
    for route in ("POST /v1/predict", "POST /v1/completions", "POST /v1/chat/completions",
                  "GET /v1/models", "GET /v1/health"):  # fmt: skip
        assert route in result.output, route


def test_stopping_prints_no_ray_shutdown_failure(server, capfd):
    """Last in the module: the server's own stop, as `aotc serve` does at Ctrl-C."""
    import ray

    stop(server)
    printed = capfd.readouterr()
    assert not ray.is_initialized()
    assert "graceful_shutdown failed" not in printed.out + printed.err, printed
    reply = json.dumps(printed.err[-500:])
    assert "Traceback" not in printed.err, reply
