"""What a hostile chat template or a greedy request can do to a serving replica, in-process through
an ASGI test client (runtime/aotc_runtime/serve/completion_server.py, no Ray): a template stopped by
its bounds is an OpenAI-shaped 500 for its request alone, it renders off the event loop (health and
other requests go on), its memory is its own process's, and an answer past --max-answer-mb ends in a
400 with its rows freed. The package is GPT-2 from the zoo with the word-level tokenizer ("w7" is
token 7), as in test_serve_openai_fields.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import tampered_copy

pytest.importorskip("ray.serve")
from starlette.testclient import TestClient  # noqa: E402
from test_serve_http import asgi, completion_server  # noqa: E402

pytestmark = pytest.mark.slow  # builds the package

# a template whose cost the user's last message picks: "hang" loops inside one Jinja builtin (no
# template line runs meanwhile), "grow" builds a 4 GB string in one call
HOSTILE_TEMPLATE = (
    "{%- set last = messages[-1]['content'] -%}"
    "{%- if last == 'hang' -%}{{ ([[1]] * 4000000) | sum(start=[]) }}"
    "{%- elif last == 'grow' -%}{% set s = 'x' * 4000000 %}{{ [s] * 1000 }}{%- endif -%}"
    "{%- for m in messages -%}w1 {{ m['content'] }} w4 {% endfor -%}w2"
)
DEADLINE_S = 2.0


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.fixture(scope="module")
def lm(generation_packages, tmp_path_factory):
    def write(folder):
        (folder / "chat_template.jinja").write_text(HOSTILE_TEMPLATE)

    def edit(manifest):
        manifest["generation"]["chat_template"] = "chat_template.jinja"

    plain = generation_packages.with_tokenizer()[0]
    target = tmp_path_factory.mktemp("hostile") / "hostile_pkg"
    return tampered_copy(plain, target, edit=edit, files=write)


@pytest.fixture(scope="module")
def client(lm):
    with TestClient(asgi(completion_server(lm))) as client:
        yield client


@pytest.fixture
def short_deadline(monkeypatch):
    monkeypatch.setattr("aotc_runtime.template_process.MAX_SECONDS", DEADLINE_S)


def chat(client, content: str, **more):
    return client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": content}], "max_tokens": 3, **more},
    )


@pytest.mark.parametrize("content, words", [("hang", "the render ran past 2 s"),
                                            ("grow", "MemoryError")])  # fmt: skip
def test_a_template_past_its_bounds_is_a_500_for_its_request_alone(
    client, short_deadline, content, words
):
    before = rss_mib()
    started = time.perf_counter()
    reply = chat(client, content)
    seconds = time.perf_counter() - started
    grew = rss_mib() - before
    assert reply.status_code == 500, reply.text
    error = reply.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "chat_template_stopped"
    assert words in error["message"] and "\n" not in error["message"]
    assert seconds < DEADLINE_S + 3 and grew < 64, (seconds, grew)  # the template's own process
    assert chat(client, "w5 w17").status_code == 200  # the next request renders afresh


def test_health_and_other_requests_answer_while_a_template_renders(client, short_deadline):
    slow: dict = {}
    hanging = threading.Thread(target=lambda: slow.update(reply=chat(client, "hang")))
    hanging.start()
    time.sleep(0.3)  # the render has started
    started = time.perf_counter()
    health = client.get("/v1/health")
    completion = client.post("/v1/completions", json={"prompt": [5, 17], "max_tokens": 2})
    seconds = time.perf_counter() - started
    hanging.join()
    assert health.status_code == 200 and completion.status_code == 200
    # not behind the render: the requests came 0.3 s into its DEADLINE_S, so waiting for it would
    # take them at least the rest (a fixed 1 s bound failed once on the busy 2-core CI: 1.53 s)
    assert seconds < DEADLINE_S - 0.3, seconds
    assert slow["reply"].status_code == 500


@pytest.fixture(scope="module")
def bounded_client(lm):
    """A server whose answers are held to 2 KiB (`aotc serve --max-answer-mb`)."""
    from aotc_runtime.serve.completion_server import CompletionServer

    server = completion_server(lm)
    server._max_answer = 2048
    assert isinstance(server, CompletionServer)
    with TestClient(asgi(server)) as client:
        yield client


def test_an_answer_past_the_servers_bound_is_a_400_and_frees_its_rows(bounded_client):
    body = {"prompt": [5], "max_tokens": 30, "n": 4, "logprobs": 5, "temperature": 0.9}
    whole = bounded_client.post("/v1/completions", json=body)
    assert whole.status_code == 400, whole.text
    error = whole.json()["error"]
    assert error["code"] == "answer_too_large" and "--max-answer-mb" in error["message"]

    with bounded_client.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: ") :])
    assert last["error"]["code"] == "answer_too_large"

    small = bounded_client.post("/v1/completions", json={"prompt": [5, 17], "max_tokens": 2})
    assert small.status_code == 200  # the rows of the cut answers were freed
    assert bounded_client.get("/v1/health").json()["waiting"] == 0
