"""The HTTP side of `aotc serve` for a text-generation package, in-process: the completion server's
routes (runtime/aotc_runtime/serve/completion_server.py) on a real package through an ASGI test
client, without Ray. What a client sees of an error (OpenAI's shape, whole and streamed), of a body
too large, and of the server's health and metadata.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import pytest
from conftest import GENERATION_MAX_LEN

pytest.importorskip("ray.serve")
from starlette.requests import Request  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from aotc_runtime.serve.app import ServeOptions, check_package, metadata  # noqa: E402
from aotc_runtime.serve.completion_server import CompletionServer  # noqa: E402
from aotc_runtime.serve.completions import max_body_bytes  # noqa: E402
from aotc_runtime.serve.ingress import refusals_counter, route  # noqa: E402
from aotc_runtime.serve.protocol import decode_request  # noqa: E402
from aotc_runtime.serve.replica import ReplicaSettings  # noqa: E402
from aotc_runtime.serve.request_log import LOGGER_NAME  # noqa: E402
from aotc_runtime.serve.shipping import PackageSource  # noqa: E402

pytestmark = pytest.mark.slow  # builds the package


def asgi(handler):
    """An ASGI app answering every HTTP request with `handler(request)` (what Ray Serve's proxy
    does with a deployment's __call__), lifespan included so one event loop serves them all."""

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        response = await handler(Request(scope, receive))
        await response(scope, receive, send)

    return app


def completion_server(package: Path, max_body: int = 64 << 20) -> CompletionServer:
    options = ServeOptions(package=package, max_body_bytes=max_body)
    info = metadata(check_package(options), options, 1)
    return CompletionServer(
        PackageSource(path=str(package.resolve())), ReplicaSettings(), info, max_body, 30.0
    )


@pytest.fixture(scope="module")
def lm(generation_packages):
    return generation_packages.with_tokenizer()[0]


@pytest.fixture(scope="module")
def server(lm):
    return completion_server(lm)


@pytest.fixture(scope="module")
def client(server):
    with TestClient(asgi(server)) as client:
        yield client


# a request's line (runtime/aotc_runtime/serve/request_log.py), every field it may have
REQUEST_LINE = re.compile(
    r"(?P<endpoint>[A-Z]+ \S+) (?P<status>\d{3}|-)(?P<stream> stream)?"
    r"( code=(?P<code>\S+))?( param=(?P<param>\S+))?"
    r"( prompt=(?P<prompt>\d+))?( cached=(?P<cached>\d+))?( completion=(?P<completion>\d+))?"
    r"( ttft=(?P<ttft>[\d.]+)ms)?( (?P<rate>[\d.]+) tok/s)?"
    r" (?P<total>[\d.]+)(?P<unit>ms|s)( \((?P<ended>[^)]+)\))?"
)


def request_lines(caplog) -> list[dict]:
    """The request lines logged so far, each as its fields (counts as ints, times in seconds)."""
    parsed = []
    for record in caplog.records:
        if record.name != LOGGER_NAME:
            continue
        match = REQUEST_LINE.fullmatch(record.getMessage())
        assert match, record.getMessage()
        fields = {key: value for key, value in match.groupdict().items() if value is not None}
        for key in ("status", "prompt", "cached", "completion"):
            if key in fields and fields[key] != "-":
                fields[key] = int(fields[key])
        fields["stream"] = "stream" in fields
        fields["total"] = float(fields["total"]) / (1000 if fields.pop("unit") == "ms" else 1)
        if "ttft" in fields:
            fields["ttft"] = float(fields["ttft"]) / 1000
        if "rate" in fields:
            fields["rate"] = float(fields["rate"])
        parsed.append(fields)
    return parsed


def assert_line_is_the_usage(line: dict, usage: dict, seconds: float) -> None:
    """A 200's line says what its answer's usage says, and times within what the client saw."""
    assert line["status"] == 200, line
    assert line["prompt"] == usage["prompt_tokens"], (line, usage)
    assert line["completion"] == usage["completion_tokens"], (line, usage)
    assert line.get("cached", 0) == usage["prompt_tokens_details"]["cached_tokens"], (line, usage)
    assert 0 < line["ttft"] <= line["total"] <= seconds + 0.01, (line, seconds)
    if usage["completion_tokens"] > 1:
        assert line["rate"] > 0, line


def assert_error(reply, status: int, message: str, param=None, code=None) -> None:
    """The reply is `status` with OpenAI's error body, carrying exactly this one-line message."""
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {
        "error": {
            "message": message,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": param,
            "code": code,
        }
    }


def test_a_refusal_has_openais_error_shape(client):
    reply = client.post("/v1/completions", json={"prompt": [5], "top_p": 2})
    assert_error(reply, 400, "'top_p': top-p 2 is outside [1e-06, 1]", param="top_p")
    reply = client.post("/v1/completions", json={"prompt": [5], "model": "another"})
    assert_error(
        reply, 404, "model 'another' is not served here; use 'gpt2_tok_pkg'", "model",
        "model_not_found",
    )  # fmt: skip
    assert_error(client.get("/v1/completions"), 405, "/v1/completions takes POST, not GET")
    # a name too long to quote whole is described, not cut
    reply = client.post("/v1/completions", json={"prompt": [5], "model": "m" * 100})
    assert_error(
        reply, 404, "model a name of 100 characters is not served here; use 'gpt2_tok_pkg'",
        "model", "model_not_found",
    )  # fmt: skip


def test_each_request_logs_one_line_that_says_its_usage_and_times(client, caplog):
    """A whole answer and a stream (with its usage chunk): the line's counts are the usage's,
    the prefix cache's reused tokens included, and its times lie within the client's."""
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    start = list(range(200, 218))  # 18 tokens no other test of the module sends
    ask = {"prompt": start + [5], "max_tokens": 6, "temperature": 0}
    assert client.post("/v1/completions", json=ask).status_code == 200
    caplog.clear()
    began = time.perf_counter()
    reply = client.post("/v1/completions", json={**ask, "prompt": start + [7, 9]})
    seconds = time.perf_counter() - began
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 18  # the line must say so
    [line] = request_lines(caplog)
    assert line["endpoint"] == "POST /v1/completions" and not line["stream"], line
    assert_line_is_the_usage(line, usage, seconds)

    caplog.clear()
    streamed = {**ask, "prompt": start + [11], "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
    began = time.perf_counter()
    with client.stream("POST", "/v1/completions", json=streamed) as reply:
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    seconds = time.perf_counter() - began
    [line] = request_lines(caplog)
    assert line["stream"] and "ended" not in line, line
    assert_line_is_the_usage(line, json.loads(events[-2])["usage"], seconds)


def test_a_refusal_logs_its_status_code_and_param_and_polls_log_nothing(client, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    client.post("/v1/completions", json={"prompt": [5], "top_p": 2})
    client.post("/v1/completions", json={"prompt": [5], "model": "another"})
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "w5"}]})
    client.get("/v1/completions")
    for path in ("/v1/health", "/v1/models", "/v1/metadata"):
        assert client.get(path).status_code == 200
    client.post("/v1/nothing")
    lines = request_lines(caplog)
    assert [{key: line.get(key) for key in ("endpoint", "status", "code", "param")}
            for line in lines] == [
        {"endpoint": "POST /v1/completions", "status": 400, "code": None, "param": "top_p"},
        {"endpoint": "POST /v1/completions", "status": 404, "code": "model_not_found",
         "param": "model"},
        {"endpoint": "POST /v1/chat/completions", "status": 400,
         "code": "chat_template_missing", "param": None},  # this package has no chat template
        {"endpoint": "GET /v1/completions", "status": 405, "code": None, "param": None},
        {"endpoint": "POST /v1/nothing", "status": 404, "code": None, "param": None},
    ]  # fmt: skip
    assert not [line for line in lines if "prompt" in line or "ttft" in line]


def test_the_openai_client_reads_the_message(client, server):
    """The official client raises with `error.message` as the text (it read nothing before)."""
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client)
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model="gpt2_tok_pkg", prompt=[5], temperature=1e-39)
    assert caught.value.message.startswith("Error code: 400 - ") or caught.value.body
    assert caught.value.body["message"].startswith("'temperature': temperature 1e-39 is outside")


@pytest.mark.parametrize(
    "body, message, param",
    [
        # both were a plain-text 500 with a traceback in the replica's log
        (
            b'{"prompt": [5, 99999999999999999999]}',
            "token id 99999999999999999999 is outside the vocabulary (0..511)",
            "prompt",
        ),
        (
            b'{"prompt": "w5 \\ud800"}',
            "'prompt' holds a lone UTF-16 surrogate (\"\\ud800\" at character 3), which is not "
            "text; send valid Unicode (a surrogate pair, or UTF-8)",
            "prompt",
        ),
        # each passed parsing, and the client got 500 "the model failed"
        (
            b'{"prompt": [5], "temperature": 1e-39}',
            "'temperature': temperature 1e-39 is outside the accepted values: 0 for greedy, or "
            "0.01 to 100 to sample",
            "temperature",
        ),
        (b'{"prompt": [5], "top_p": 1e-46}', "'top_p': top-p 1e-46 is outside [1e-06, 1]", "top_p"),
        (
            b'{"prompt": [5], "seed": 18446744073709551616}',
            "'seed': seed 18446744073709551616 is not a whole number from 0 to 2**64-1",
            "seed",
        ),
    ],
)
def test_what_was_a_500_is_a_400_with_one_line(client, body, message, param):
    reply = client.post("/v1/completions", content=body)
    assert_error(reply, 400, message, param)
    ok = client.post("/v1/completions", json={"prompt": [5], "max_tokens": 1, "temperature": 0})
    assert ok.status_code == 200, ok.text


def test_nulls_mean_defaults_and_temperature_above_2_is_served(client):
    nulls = dict.fromkeys(["top_p", "seed", "stop", "stream", "user", "n", "logprobs", "echo"])
    reply = client.post("/v1/completions", json={"prompt": "w5", "max_tokens": None, **nulls})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] <= 16
    reply = client.post(
        "/v1/completions", json={"prompt": [5], "max_tokens": 2, "temperature": 50, "seed": 1}
    )
    assert reply.status_code == 200, reply.text


def test_the_413_names_the_real_limit_and_fix(client, lm):
    """The completion body limit is the package's (16 KiB + 64 B a cache token), so the 413 must
    not send the user to --max-body-mb, which cannot raise it."""
    limit = max_body_bytes(32)
    reply = client.post("/v1/completions", content=b" " * (limit + 1))
    assert_error(
        reply, 413,
        f"request body is {limit + 1} bytes, above the {limit} a prompt of at most 32 tokens "
        "(this package's cache) needs; send a shorter prompt, or serve a package exported with "
        "a larger --max-seq-len",
        "prompt", "request_too_large",
    )  # fmt: skip
    # below the package's limit, --max-body-mb is the limit, and the flag is the fix
    small = completion_server(lm, max_body=1000)
    with TestClient(asgi(small)) as other:
        reply = other.post("/v1/completions", content=b" " * 1001)
    assert_error(
        reply, 413,
        "request body is 1001 bytes, above this server's limit of 1000; send smaller batches "
        "(or start the server with a larger --max-body-mb)",
        None, "request_too_large",
    )  # fmt: skip


def test_a_stream_that_fails_ends_with_an_openai_error_event(client, server, monkeypatch, caplog):
    import aotc_runtime.decode_engine
    from aotc_runtime.decode_engine import Made

    class Failing:
        """A running batch whose second step fails on the device."""

        def __init__(self, _package, **_options):
            self.keys: list = []

        active = property(lambda self: len(self.keys))

        has_free_row = True

        def waits_for_prefix(self, _prompt):
            return False

        def join(self, key, _request):
            self.keys.append(key)
            return 0  # prompt tokens reused

        def step(self):
            if not hasattr(self, "stepped"):
                self.stepped = True
                return [Made(self.keys[0], 7, None, "")]
            raise RuntimeError("CUDA error: out of memory")

        def leave(self, _key):
            pass

        def release(self):
            pass

    monkeypatch.setattr(aotc_runtime.decode_engine, "DecodeEngine", Failing)
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    body = {"prompt": [5], "max_tokens": 4, "temperature": 0.5, "seed": 1, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as reply:
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert reply.status_code == 200
    assert json.loads(events[0])["choices"][0]["token_ids"] == [7]
    assert json.loads(events[1]) == {
        "error": {
            "message": "the model failed on this request: RuntimeError: CUDA error: out of memory",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert events[2:] == ["[DONE]"]
    [line] = request_lines(caplog)  # its 200 went with its first event: the line says more
    said = {key: line.get(key) for key in ("status", "stream", "prompt", "completion", "ended")}
    assert said == {"status": 200, "stream": True, "prompt": 1, "completion": 1,
                    "ended": "stream ended by error 500"}, line  # fmt: skip


def test_a_client_that_leaves_mid_stream_ends_its_request_there_and_frees_its_row(
    client, server, caplog, monkeypatch
):
    """The client takes the first send, reads no more and leaves: its request's line says it
    ended there, with the tokens sent until then, and its row is free for the next request. The
    second send is held until the leave is delivered, so the leave always comes before the stream
    could end (over Ray, test_serve_completions.py, it races the generation). Steps of at least
    20 ms keep the first send to the first token or two however busy the machine: unpaced, this
    package makes its 31 tokens in about 40 ms, which a loaded machine's first send can outlast."""
    import anyio

    import aotc_runtime.decode_engine as decode_engine

    class Paced(decode_engine.DecodeEngine):
        def step(self):
            time.sleep(0.02)
            return super().step()

    monkeypatch.setattr(decode_engine, "DecodeEngine", Paced)
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    body = {"prompt": [5], "max_tokens": GENERATION_MAX_LEN - 1, "temperature": 0, "stream": True}
    sent: list[bytes] = []

    async def leave_after_the_first_event() -> None:
        first_event = anyio.Event()
        messages = [{"type": "http.request", "body": json.dumps(body).encode()}]

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await first_event.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                sent.append(message["body"])
                first_event.set()
                await anyio.sleep_forever()  # a client that reads no more

        scope = {
            "type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
            "root_path": "", "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
        }  # fmt: skip
        with anyio.fail_after(60):
            await asgi(server)(scope, receive, send)

    client.portal.call(leave_after_the_first_event)
    # the first send: one event, or a few when the model ran ahead of the stream (each send takes
    # every token waiting)
    [first] = sent
    events = [json.loads(e.removeprefix(b"data: ")) for e in first.split(b"\n\n") if e.strip()]
    tokens = sum(len(event["choices"][0]["token_ids"]) for event in events)
    assert 1 <= tokens < GENERATION_MAX_LEN - 1, first
    [line] = request_lines(caplog)
    said = {key: line.get(key) for key in ("status", "stream", "prompt", "completion", "ended")}
    assert said == {"status": 200, "stream": True, "prompt": 1, "completion": tokens,
                    "ended": "client disconnected"}, line  # fmt: skip
    health = client.get("/v1/health").json()
    assert health["waiting"] == 0, health
    reply = client.post("/v1/completions", json={"prompt": [7, 8], "max_tokens": 4})
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) == 4


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_answer_with_non_finite_logits_fails_its_request_alone_in_openais_shape(
    client, server, monkeypatch, stream
):
    """The engine ends a row whose logits were not finite with FinishReason.ERROR (its neighbours go
    on: test_decode_engine.py): its request hears a 500 in OpenAI's shape, as JSON or as the
    stream's last event before [DONE], never a token outside the vocabulary."""
    import aotc_runtime.decode_engine
    from aotc_runtime.decode_engine import Made
    from aotc_runtime.finish_reason import FinishReason
    from aotc_runtime.serve.completion_engine import NON_FINITE_MESSAGE

    class NonFinite:
        """A running batch whose row's logits turn non-finite at its second token."""

        def __init__(self, _package, **_options):
            self.keys: list = []
            self.steps = 0

        active = property(lambda self: len(self.keys))

        has_free_row = True

        def waits_for_prefix(self, _prompt):
            return False

        def join(self, key, _request):
            self.keys.append(key)
            return 0  # prompt tokens reused

        def step(self):
            self.steps += 1
            key = self.keys[0]
            if self.steps == 1:
                return [Made(key, 7, None, "")]
            self.keys.remove(key)
            return [Made(key, 0, FinishReason.ERROR)]

        def leave(self, key):
            if key in self.keys:
                self.keys.remove(key)

        def release(self):
            pass

    monkeypatch.setattr(aotc_runtime.decode_engine, "DecodeEngine", NonFinite)
    body = {"prompt": [5], "max_tokens": 4, "temperature": 0.5, "seed": 1, "stream": stream}
    error = {"message": NON_FINITE_MESSAGE, "type": "server_error", "param": None, "code": None}
    if not stream:
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 500 and reply.json() == {"error": error}, reply.text
        return
    with client.stream("POST", "/v1/completions", json=body) as reply:
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["token_ids"] == [7]
    assert json.loads(events[1]) == {"error": error}
    assert events[2:] == ["[DONE]"]


def test_health_metadata_and_models_say_nothing_of_the_host_or_paths(client, lm):
    import os
    import socket

    secrets = [str(lm.resolve()), str(lm.resolve().parent), socket.gethostname(), str(os.getpid())]
    health = client.get("/v1/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["model"] == lm.resolve().name
    assert not {"host", "pid", "package", "reason"} & set(health.json())
    for path in ("/v1/health", "/v1/metadata", "/v1/models"):
        text = client.get(path).text
        assert not [s for s in secrets if s in text], (path, text)
    assert client.get("/v1/metadata").json()["model"] == lm.resolve().name


def test_predict_refusals_have_openais_error_shape(lm):
    """/v1/predict's route (the ingress's) answers the same shape: here a handler that decodes."""
    signature = check_package(ServeOptions(package=lm)).signature

    async def predict(request: Request):
        decode_request(await request.body(), request.headers.get("content-type"), signature)
        raise AssertionError("the body is refused first")

    async def routed(request: Request):
        return await route(request, {"/v1/predict": ("POST", predict)}, refusals_counter())

    with TestClient(asgi(routed)) as client:
        reply = client.post("/v1/predict", content=b"x", headers={"content-type": "text/plain"})
        assert_error(
            reply, 415,
            "Content-Type text/plain is not served; use application/json or application/x-npz",
        )  # fmt: skip
        assert_error(client.post("/v1/nothing"), 404, "no route /v1/nothing; use /v1/predict")


def test_top_k_is_accepted_and_top_k_1_is_greedy(client):
    """`top_k` over HTTP, as `aotc generate --top-k` and the Python API take it."""
    ask = {"prompt": [5, 17, 42], "max_tokens": 6}
    greedy = client.post("/v1/completions", json={**ask, "temperature": 0})
    top1 = client.post("/v1/completions", json={**ask, "temperature": 0.9, "top_k": 1, "seed": 3})
    assert greedy.status_code == 200 and top1.status_code == 200, top1.text
    tokens = [reply.json()["choices"][0]["token_ids"] for reply in (greedy, top1)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 6
