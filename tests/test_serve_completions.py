"""`aotc serve` of a text-generation package: OpenAI completions on a local Ray, over loopback,
against `aotc generate` and the runtime's own `generate` for the same request.

One server for the module: GPT-2 from the zoo (weights scaled) with a word-level tokenizer
("w7" is token 7), batch 2, a 32-token cache. Request loops are bounded: a fixed number of
requests from a fixed number of client threads, each with a timeout.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import torch
from conftest import GENERATION_MAX_LEN, free_port, invoke

pytest.importorskip("ray.serve")

from test_serve_http import assert_line_is_the_usage, request_lines  # noqa: E402

import aotc_runtime  # noqa: E402
from aotc_runtime.serve.app import ServeOptions, start, stop  # noqa: E402
from aotc_runtime.serve.request_log import LOGGER_NAME  # noqa: E402

pytestmark = pytest.mark.slow
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def lm(generation_packages):
    return generation_packages.with_tokenizer()[0]


@pytest.fixture(scope="module")
def server(lm):
    running = start(ServeOptions(package=lm, port=free_port(), metrics_port=free_port()))
    yield running
    stop(running)


@pytest.fixture(scope="module")
def model_name(lm):
    return lm.resolve().name


def post(url: str, body, path: str = "/v1/completions") -> tuple[int, dict]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_S)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.request("POST", path, data, {"Content-Type": "application/json"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, answer


def stream(url: str, body: dict) -> list:
    """The data of each server-sent event, up to and with [DONE]."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_S)
    connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}).encode())
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("content-type").startswith(
        "text/event-stream"
    )
    events = [
        line[len(b"data: ") :].decode()
        for line in response.read().split(b"\n")
        if line.startswith(b"data: ")
    ]
    connection.close()
    return events


def expected_ids(lm, prompt_ids: list, max_tokens: int) -> list:
    """The runtime's own greedy answer for one prompt, alone: the new tokens, cut after an
    end-of-sequence token as a completion is."""
    package = aotc_runtime.load(lm)
    new = package.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens)[0]
    new = new[len(prompt_ids) :].tolist()
    eos = set(package.manifest.generation.eos_token_ids)
    ends = [i for i, token in enumerate(new) if token in eos]
    return new[: ends[0] + 1] if ends else new


def test_completions_equal_aotc_generate_whole_and_streamed(server, lm, model_name):
    generated = invoke("generate", lm, "--prompt", "w5 w17 w42", "--max-new-tokens", 8, "--json")
    assert generated.exit_code == 0, generated.stderr
    report = json.loads(generated.stdout)
    request = {"model": model_name, "prompt": "w5 w17 w42", "max_tokens": 8, "temperature": 0}
    status, answer = post(server.url, request)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["token_ids"] == report["generated_ids"][0]
    assert choice["text"] == report["generated_text"][0]
    assert answer["object"] == "text_completion" and answer["model"] == model_name
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11,
                               "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    assert choice["finish_reason"] == "length"
    # the same request by ids, and streamed: the chunks add up to the same answer
    status, by_ids = post(server.url, {**request, "prompt": [5, 17, 42]})
    assert by_ids["choices"][0]["token_ids"] == choice["token_ids"]
    events = stream(server.url, request)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event)["choices"][0] for event in events[:-1]]
    assert [t for c in chunks for t in c["token_ids"]] == choice["token_ids"]
    assert "".join(c["text"] for c in chunks) == choice["text"]
    assert [c["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]


def lines_logged(caplog, wanted, count: int) -> list[dict]:
    """The `count` request lines `wanted(line)` picks, once `aotc serve`'s process has logged
    them (they come from the replica through Ray)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        lines = [line for line in request_lines(caplog) if wanted(line)]
        if len(lines) >= count or time.monotonic() > deadline:
            assert len(lines) == count, "\n".join(map(json.dumps, request_lines(caplog)))
            return lines
        time.sleep(0.1)


def test_each_request_is_one_line_in_the_process_that_started_the_server(server, caplog):
    """The replica's logging goes to Ray's files; its request lines reach the process that
    started the server, each saying what its answer's usage says."""
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    request = {"prompt": [9, 8, 7, 6, 5, 4, 3], "max_tokens": 5, "temperature": 0}
    began = time.perf_counter()
    status, answer = post(server.url, request)
    whole_seconds = time.perf_counter() - began
    assert status == 200, answer
    began = time.perf_counter()
    events = stream(server.url, {**request, "stream_options": {"include_usage": True}})
    stream_seconds = time.perf_counter() - began
    lines = lines_logged(caplog, lambda line: line.get("prompt") == 7, 2)
    whole, streamed = sorted(lines, key=lambda line: line["stream"])
    assert whole["endpoint"] == streamed["endpoint"] == "POST /v1/completions"
    assert_line_is_the_usage(whole, answer["usage"], whole_seconds)
    assert_line_is_the_usage(streamed, json.loads(events[-2])["usage"], stream_seconds)


def test_a_prompt_that_starts_as_an_earlier_one_is_fed_only_the_rest(server, lm, model_name):
    """The prefix cache, on by default: a request whose first 18 tokens are an earlier request's
    is fed the rest only, says so in its usage, and answers as the runtime does alone; streamed,
    the usage chunk says the same."""
    start = list(range(100, 118))  # 18 tokens no other test sends
    first = {"model": model_name, "prompt": start + [5], "max_tokens": 4, "temperature": 0}
    status, answer = post(server.url, first)
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    for prompt in (start + [7, 9], start + [11]):
        status, again = post(server.url, {**first, "prompt": prompt})
        assert status == 200, again
        assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 18}
        assert again["choices"][0]["token_ids"] == expected_ids(lm, prompt, 4)
    events = stream(server.url, {**first, "stream_options": {"include_usage": True}})
    assert json.loads(events[-2])["usage"]["prompt_tokens_details"] == {"cached_tokens": 18}


def test_a_stop_string_ends_the_text_before_it(server, model_name):
    request = {"model": model_name, "prompt": "w5 w17 w42", "max_tokens": 8, "temperature": 0}
    whole = post(server.url, request)[1]["choices"][0]
    words = whole["text"].split()
    # the first new word not seen before it (with the space before it) ends the text
    at = next(i for i in range(1, len(words)) if words[i] not in words[:i])
    status, answer = post(server.url, {**request, "stop": [" " + words[at]]})
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["text"] == " ".join(words[:at]) and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == whole["token_ids"][: at + 1]


def test_the_openai_client_talks_to_it_unchanged(server, lm, model_name):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=TIMEOUT_S)
    assert [m.id for m in client.models.list().data] == [model_name]
    expected = expected_ids(lm, [5, 17, 42], 6)
    answer = client.completions.create(
        model=model_name, prompt="w5 w17 w42", max_tokens=6, temperature=0
    )
    assert answer.choices[0].text == " ".join(f"w{t}" for t in expected)
    assert answer.usage.completion_tokens == len(expected)
    streamed = client.completions.create(
        model=model_name, prompt="w5 w17 w42", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed).split() == [
        f"w{t}" for t in expected
    ]


def test_50_concurrent_requests_each_equal_their_own_answer(server, lm, model_name):
    generator = torch.Generator().manual_seed(3)
    requests = []
    for _ in range(50):
        length = int(torch.randint(1, 9, (1,), generator=generator))
        prompt = torch.randint(3, 512, (length,), generator=generator).tolist()
        max_tokens = int(torch.randint(1, 12, (1,), generator=generator))
        requests.append(
            {"model": model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        )
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda r: post(server.url, r), requests))
    health = json.loads(get(server.url, "/v1/health")[1])
    for request, (status, answer) in zip(requests, answers):
        assert status == 200, answer
        expected = expected_ids(lm, request["prompt"], request["max_tokens"])
        assert answer["choices"][0]["token_ids"] == expected, request
    replica = health["replicas"][0] if "replicas" in health else health
    # requests that arrived together shared generations (the package's batch is 2)
    assert replica["generations"] < replica["requests"], replica


def get(url: str, path: str) -> tuple[int, str]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_S)
    connection.request("GET", path)
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    return response.status, text


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not JSON"),
        ({"prompt": "w5", "max_tokens": "many"}, 400, "max_tokens"),
        ({"prompt": "w5", "max_tokens": GENERATION_MAX_LEN}, 400, "cache"),
        ({"prompt": [5, 100000], "max_tokens": 2}, 400, "vocabulary"),
        ({"prompt": [], "max_tokens": 2}, 400, "empty"),
        ({"prompt": "w5", "best_of": 2}, 400, "'best_of'"),
        ({"prompt": "w5", "model": "another"}, 404, "not served here"),
    ],
)
def test_bad_requests_get_one_line_and_the_server_keeps_answering(
    server, model_name, body, status, words
):
    got, answer = post(server.url, body)
    assert got == status, answer
    message = answer["error"]["message"]
    assert words in message and "\n" not in message, answer
    ok, _ = post(server.url, {"prompt": [5], "max_tokens": 1, "temperature": 0})
    assert ok == 200


@pytest.mark.parametrize("fails_in", ["the batch", "the join"])
def test_a_running_batch_that_fails_answers_the_waiting_request_with_the_error(
    monkeypatch, fails_in
):
    """A greedy request whose running batch cannot start, or cannot take it, hears why (a 500)
    instead of waiting forever, and the next request is taken (on the H100 a request left
    unanswered this way hung its client)."""
    import asyncio
    import collections

    import aotc_runtime.decode_engine
    from aotc_runtime.generation_request import GenerationRequest
    from aotc_runtime.serve.completion_engine import CompletionEngine, Job, Reply
    from aotc_runtime.serve.request_fields import Choice

    class Gauge:
        def set(self, _value):
            pass

    class Batch:
        active = 0

        def __init__(self, _package, **_options):
            if fails_in == "the batch":
                raise RuntimeError("CUDA error: out of memory")

        has_free_row = True

        def waits_for_prefix(self, _prompt):
            return False

        def join(self, _key, _request):
            raise RuntimeError("CUDA error: out of memory")

        def release(self):
            pass

    monkeypatch.setattr(aotc_runtime.decode_engine, "DecodeEngine", Batch)
    loop = asyncio.new_event_loop()
    choice = Choice(0, 0, GenerationRequest((5, 6), 4))
    first = Job(choice, Reply(loop, asyncio.Queue()))
    second = Job(choice, Reply(loop, asyncio.Queue()))
    engine = CompletionEngine.__new__(CompletionEngine)  # the queue logic alone, no package
    engine.tokenizer, engine.package, engine.counts = None, None, collections.Counter()
    engine.prefix_cache = None
    engine._queued = engine._active = Gauge()
    engine._pending = collections.deque([first, second])
    engine._pending_lock = threading.Lock()
    engine._run_batch()
    loop.run_until_complete(asyncio.sleep(0))  # the events sent from "the package's thread"
    event = first.reply.events.get_nowait()
    assert event["error"] == 500 and "CUDA error: out of memory" in event["message"]
    assert list(engine._pending) == [second] and second.reply.events.empty()
    loop.close()


def test_a_client_that_leaves_mid_stream_frees_the_package(server, model_name, caplog):
    """Over Ray's proxy. This package makes its 31 tokens in about 40 ms, so on a loaded machine
    the whole generation may end before the leave reaches the replica: the line then says the
    stream ended whole. That the leave ends the request where it is, every time, is checked
    without Ray in test_serve_http.py, where the leave is delivered before the stream can end."""
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    parts = urlsplit(server.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_S)
    body = {"prompt": [5], "max_tokens": GENERATION_MAX_LEN - 1, "temperature": 0, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body).encode())
    response = connection.getresponse()
    assert response.status == 200
    assert response.read(6) == b"data: "  # the first token came
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    status, answer = post(server.url, {"prompt": [7, 8], "max_tokens": 4, "temperature": 0})
    assert status == 200 and len(answer["choices"][0]["token_ids"]) == 4, answer
    health = json.loads(get(server.url, "/v1/health")[1])
    replica = health["replicas"][0] if "replicas" in health else health
    assert replica["waiting"] == 0, replica
    # its line says it ended there, with the tokens made until then, unless it had made them all
    [left] = lines_logged(caplog, lambda line: line.get("stream") and line.get("prompt") == 1, 1)
    assert left["status"] == 200, left
    if left.get("ended") != "client disconnected":
        assert "ended" not in left and left["completion"] == GENERATION_MAX_LEN - 1, left
    else:
        assert 1 <= left["completion"] < GENERATION_MAX_LEN - 1, left


def test_serve_check_sends_a_completion(server, capsys):
    from aotc_runtime.serve.command import check_once

    assert check_once(server) == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert printed["object"] == "text_completion"
    assert len(printed["choices"][0]["token_ids"]) == 4


def test_a_seeded_sampled_request_repeats_and_equals_the_runtimes(server, lm):
    request = {"prompt": [5, 17, 42], "max_tokens": 10, "temperature": 0.9, "top_p": 0.95}
    first = post(server.url, {**request, "seed": 11})[1]["choices"][0]["token_ids"]
    assert post(server.url, {**request, "seed": 11})[1]["choices"][0]["token_ids"] == first
    package = aotc_runtime.load(lm)
    expected = package.generate(
        torch.tensor([[5, 17, 42]]), max_new_tokens=10, temperature=0.9, top_p=0.95, seed=11
    )[0, 3:].tolist()
    eos = set(package.manifest.generation.eos_token_ids)
    ends = [i for i, token in enumerate(expected) if token in eos]
    assert first == (expected[: ends[0] + 1] if ends else expected)


def test_waiting_requests_join_the_running_batch_in_order_while_rows_are_free():
    """The engine's admission (fake batches of 1 and 3 rows; a request's room in a row's cache was
    checked when it was parsed): waiting requests join in arrival order, greedy or sampled (each
    row samples by its own settings); one that finds no free row waits, and those behind it wait
    too; a gone one is dropped."""
    import asyncio
    import collections

    from aotc_runtime.generation_request import GenerationRequest
    from aotc_runtime.sampling import Sampling
    from aotc_runtime.serve.completion_engine import CompletionEngine, Job, Reply
    from aotc_runtime.serve.request_fields import Choice

    def job(prompt_tokens: int, max_tokens: int, temperature: float = 0.0) -> Job:
        sampling = Sampling(temperature, seed=7 if temperature else None)
        request = GenerationRequest((5,) * prompt_tokens, max_tokens, sampling)
        return Job(Choice(0, 0, request), Reply(None, asyncio.Queue()))  # type: ignore[arg-type]

    class Batch:
        def __init__(self, rows: int):
            self.rows = rows
            self.joined: list = []
            self.sampling: list = []

        @property
        def active(self):
            return len(self.joined)

        @property
        def has_free_row(self):
            return len(self.joined) < self.rows

        def waits_for_prefix(self, _prompt):
            return False

        def join(self, _key, request):
            self.joined.append((len(request.prompt), request.max_new_tokens))
            self.sampling.append(request.sampling)
            return 0  # prompt tokens reused

    engine = CompletionEngine.__new__(CompletionEngine)  # the queue logic alone, no package
    engine.tokenizer = None
    a, b, c, d = job(10, 10), job(10, 10), job(2, 2), job(3, 3, 0.8)
    gone = job(1, 1)
    gone.reply.gone = True
    engine._pending = collections.deque([gone, a, b, c, d])
    engine._pending_lock = threading.Lock()
    batch, rows = Batch(rows=1), {}
    engine._admit(batch, rows)
    assert [rows[key].job for key in rows] == [a]  # b finds no row beside a; c waits behind b
    assert list(engine._pending) == [b, c, d]
    second = Batch(rows=3)
    engine._admit(second, rows)  # an empty batch: b, c and the sampled d join
    assert [rows[key].job for key in rows] == [a, b, c, d] and not engine._pending
    greedy, sampled = second.sampling[0], second.sampling[2]
    assert greedy.greedy and sampled.temperature == 0.8 and sampled.seed == 7


def test_a_request_with_many_answers_takes_turns_with_the_requests_behind_it():
    """A request of n=6 answers and a one-answer request behind it, on a fake batch of 2 rows:
    the second request takes the second row at once (in arrival order it would wait for the
    first's six answers), and each row freed goes to the request holding the fewest."""
    import asyncio
    import collections

    from aotc_runtime.generation_request import GenerationRequest
    from aotc_runtime.serve.completion_engine import CompletionEngine, Job, Reply
    from aotc_runtime.serve.request_fields import Choice

    class Batch:
        def __init__(self):
            self.joined: list = []

        @property
        def active(self):
            return len(self.joined)

        @property
        def has_free_row(self):
            return len(self.joined) < 2

        def waits_for_prefix(self, _prompt):
            return False

        def join(self, key, _request):
            self.joined.append(key)
            return 0  # prompt tokens reused

    request = GenerationRequest((5, 6), 4)
    large = Reply(None, asyncio.Queue())  # type: ignore[arg-type]
    small = Reply(None, asyncio.Queue())  # type: ignore[arg-type]
    answers = [Job(Choice(i, 0, request), large) for i in range(6)]
    alone = Job(Choice(0, 0, request), small)
    engine = CompletionEngine.__new__(CompletionEngine)  # the queue logic alone, no package
    engine._pending = collections.deque([*answers, alone])
    engine._pending_lock = threading.Lock()
    batch, rows = Batch(), {}
    engine._admit(batch, rows)
    assert [rows[key].job for key in batch.joined] == [answers[0], alone]
    batch.joined.remove(id(alone))  # the small request ends: its row goes back to the large one
    del rows[id(alone)]
    engine._admit(batch, rows)
    assert [rows[key].job for key in batch.joined] == [answers[0], answers[1]]
    assert list(engine._pending) == answers[2:]


def test_a_generating_cpu_replica_leaves_a_core_to_its_http_side(monkeypatch):
    """Default intra-op threads: physical cores / replicas, one fewer for a text-generation
    package (its event loop streams every token while its thread steps); --threads is taken as
    given."""
    from types import SimpleNamespace

    import aotc_runtime.threads
    from aotc_runtime.serve import app

    monkeypatch.setattr(aotc_runtime.threads, "default_threads", lambda: 8)
    cpu = SimpleNamespace(type="cpu")
    plain = SimpleNamespace(device=cpu, generation=None)
    generating = SimpleNamespace(device=cpu, generation=object())
    options = ServeOptions(package=None, replicas=2)  # type: ignore[arg-type]
    assert app._resources(options, plain) == (4, 0.0)
    assert app._resources(options, generating) == (3, 0.0)
    monkeypatch.setattr(aotc_runtime.threads, "default_threads", lambda: 2)
    assert app._resources(options, generating) == (1, 0.0)  # never below one
    given = ServeOptions(package=None, replicas=2, threads=2)  # type: ignore[arg-type]
    assert app._resources(given, generating) == (2, 0.0)
