"""The HTTP side of `aotc serve`: routes, request checks, answers, and retries on a replica's death.

The ingress is its own Ray Serve deployment in front of the model replicas:
- a bad request is refused here, before it takes a place in a batch;
- a request whose model replica dies while answering (a crash, a killed process, a lost node) is
  sent again to another replica, up to RETRIES times. A request is idempotent (a package with
  state is served by one replica without retries), so nothing is answered twice or wrongly. Ray
  Serve's own proxy answers a bare "500 Internal Server Error" in that case.

A body must arrive within the body timeout (`--body-timeout-s`), or the request gets 408 and its
connection is closed: a client that declares a length and sends part of it holds a connection and a
task until then, no longer. Bodies are decoded (and answers encoded) by
runtime/aotc_runtime/serve/codec.py: large ones in worker processes, so that a slow decode never
holds up the event loop and /v1/health.

Every refusal is JSON in OpenAI's error shape, with its status: `{"error": {"message": "<one line:
what is wrong and what to do>", "type": "invalid_request_error" (4xx) or "server_error" (5xx),
"param": <the request field at fault, or null>, "code": <null or a short string>}}`
(protocol.error_body). /v1/health says whether the server is ready, nothing about where it runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import cast

from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.serve import Deployment
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from ray.serve.metrics import Counter
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from aotc_runtime.serve.codec import Codec
from aotc_runtime.serve.protocol import (
    DRAIN_CHECK_S,
    NPZ_TYPE,
    RequestError,
    body_too_large,
    media_type,
    said_whole,
)
from aotc_runtime.serve.replica import ReplicaRefusedError
from aotc_runtime.serve.request_log import RequestLog, RequestRecord

logger = logging.getLogger("ray.serve")

RETRY_DELAYS_S = (0.1, 0.5, 1.0, 2.0, 4.0)  # ~8 s in all: Ray notices a dead replica within ~2 s
HEALTH_TIMEOUT_S = 10.0


class BodyTimeoutError(RequestError):
    """408: the body did not all arrive in time. The answer closes the connection: what is left of
    the body may still come, and the client stopped sending, so closing loses nothing (a 413 keeps
    the connection: a client still sending its large body would get a reset instead of the 413)."""

    headers = {"Connection": "close"}


class ClosingStream(StreamingResponse):
    """A stream whose body is closed as soon as the response ends, however it ends. Starlette
    cancels a stream whose client left while it waits to send, and leaves the body's generator
    suspended at its `yield`: its cleanup (freeing the engine's rows, writing the request's line)
    would then wait for the garbage collector, which an idle replica may not run for minutes.
    Closing it here runs that cleanup at once."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


def json_response(data: dict, status: int = 200, headers: dict | None = None) -> Response:
    return Response(
        json.dumps(data), status_code=status, media_type="application/json", headers=headers
    )


def refusals_counter() -> Counter:
    return Counter(
        "aotc_refused_requests",
        description="Requests answered with an error, by HTTP status.",
        tag_keys=("status",),
    )


async def route(
    request: Request, routes: dict, refusals: Counter, log: RequestLog | None = None
) -> Response:
    """The answer of the handler `routes` names for the request's path and method, or the
    refusal (counted) its RequestError gives: path -> (method, async handler). The request's
    line goes to `log` (runtime/aotc_runtime/serve/request_log.py); a handler finds its
    RequestRecord in `request.state.record`, and a stream writes it when it ends."""
    path = request.url.path.rstrip("/")
    record = request.state.record = RequestRecord(f"{request.method} {path or '/'}")
    try:
        if path not in routes:
            raise RequestError(404, f"no route {path or '/'}; use {', '.join(routes)}")
        method, handler = routes[path]
        if request.method != method:
            raise RequestError(405, f"{path} takes {method}, not {request.method}")
        response = await handler(request)
        record.status = response.status_code
    except RequestError as exc:
        refusals.inc(tags={"status": str(exc.status)})
        record.refused(exc)
        response = json_response(exc.body(), exc.status, getattr(exc, "headers", None))
    except asyncio.CancelledError:  # the client left before its answer
        record.ended = "client disconnected"
        if log is not None:
            log.write(record)
        raise
    if log is not None and not record.stream:
        log.write(record)
    return response


async def read_body(
    request: Request,
    limit: int,
    timeout_s: float,
    too_large: Callable[[int | str, int], RequestError] = body_too_large,
) -> bytes:
    """The body, never holding more than the limit: a declared length above it is refused
    before reading, a body that grows past it as soon as it does, and one that has not all
    arrived within the body timeout when it expires. `too_large(size, limit)` is the 413, which
    says how to send less (or where the limit comes from)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks: list[bytes] = []

    async def read() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(f"more than {limit}", limit)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        got = sum(map(len, chunks))
        raise BodyTimeoutError(
            408,
            f"request body did not arrive within {timeout_s:g} s ({got} bytes "
            f"{f'of {declared} ' if declared else ''}came); send it faster, or start the "
            "server with a larger --body-timeout-s",
            code="timeout",
        ) from None
    return b"".join(chunks)


class Ingress:
    def __init__(
        self,
        model: DeploymentHandle,
        metadata: dict,
        max_body_bytes: int,
        retry: bool,
        body_timeout_s: float,
        request_log: str | None = None,
    ):
        self._model = model
        self._log = RequestLog(request_log)  # the sink's name, when `aotc serve` shows the lines
        self._metadata = metadata
        self._codec = Codec(metadata["signature"], max_body_bytes)
        self._max_body = max_body_bytes
        self._body_timeout = body_timeout_s
        self._delays = RETRY_DELAYS_S if retry else ()
        self._refusals = refusals_counter()
        self._retries = Counter(
            "aotc_retried_requests",
            description="Requests sent again because their model replica died while answering.",
        )

    async def __call__(self, request: Request) -> Response:
        routes = {
            "/v1/predict": ("POST", self._predict),
            "/v1/health": ("GET", self._health),
            "/v1/metadata": ("GET", self._metadata_response),
        }
        return await route(request, routes, self._refusals, self._log)

    async def _predict(self, request: Request) -> Response:
        """The answer, with a Server-Timing header saying where the request's time went: reading
        and checking it here, its model replica round trip, and inside that the package call."""
        start = time.perf_counter()
        body = await self._read_body(request)
        read = time.perf_counter()
        kind = media_type(request.headers.get("content-type"))
        tensors = await self._codec.decode(body, kind)
        decoded = time.perf_counter()
        answer = await self._call_model(tensors)
        answered = time.perf_counter()
        data, content_type = await self._codec.encode(
            answer["outputs"], NPZ_TYPE if kind == NPZ_TYPE else ""
        )
        timing = (
            f"read;dur={(read - start) * 1000:.3f}, decode;dur={(decoded - read) * 1000:.3f}, "
            f"replica;dur={(answered - decoded) * 1000:.3f}, "
            f"queued;dur={answer['queued_ms']:.3f}, call;dur={answer['call_ms']:.3f}, "
            f"encode;dur={(time.perf_counter() - answered) * 1000:.3f}, "
            f'batch;desc="{answer["batch_rows"]} rows"'
        )
        return Response(data, media_type=content_type, headers={"Server-Timing": timing})

    async def _read_body(self, request: Request) -> bytes:
        return await read_body(request, self._max_body, self._body_timeout)

    async def _call_model(self, tensors: list) -> dict:
        for attempt in range(len(self._delays) + 1):
            try:
                return await self._model.predict.remote(tensors)
            except ReplicaRefusedError as exc:
                raise RequestError(503, str(exc)) from None
            except BackPressureError:
                raise RequestError(
                    503, "the model replicas' queues are full; retry later or add --replicas"
                ) from None
            except (RayActorError, ActorUnavailableError) as exc:
                if attempt == len(self._delays):
                    raise RequestError(
                        503,
                        f"the model replica died while answering, {attempt + 1} time(s) "
                        f"({type(exc).__name__}); retry later",
                    ) from None
                self._retries.inc()
                logger.warning("model replica died (%s); retrying the request", type(exc).__name__)
                await asyncio.sleep(self._delays[attempt])
            # the model raised: a bug or a broken package, not the request
            except RayTaskError as exc:
                cause = exc.cause if exc.cause is not None else exc
                lines = str(cause).strip().splitlines()  # a traceback's last line says what
                said = said_whole(lines[-1]) if lines else None
                raise RequestError(
                    500, f"the model failed on this request: {said or type(cause).__name__}"
                ) from None
        raise AssertionError("unreachable")

    async def _health(self, request: Request) -> Response:
        try:
            state = await asyncio.wait_for(self._model.health.remote(), HEALTH_TIMEOUT_S)
        except (asyncio.TimeoutError, RayActorError, ActorUnavailableError) as exc:
            logger.warning("no model replica answered /v1/health (%r)", exc)
            return json_response({"status": "unavailable", "model": self._metadata["model"]}, 503)
        state = {"model": self._metadata["model"], **state}
        return json_response(state, 200 if state["status"] == "ok" else 503)

    async def _metadata_response(self, request: Request) -> Response:
        return json_response(self._metadata)

    def __del__(self) -> None:  # Ray Serve's shutdown hook for a replica
        codec = getattr(self, "_codec", None)  # None: __init__ failed before it
        if codec is not None:
            codec.close()


def ingress_deployment(replicas: int) -> Deployment:
    """The Ingress class as a Ray Serve deployment (decorated here, so importing it needs no Ray Serve running)."""
    deployment = serve.deployment(
        Ingress,
        name="aotc-ingress",
        num_replicas=replicas,
        # decoding and checking a request is light next to the model: it takes no CPU of its own
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=1024,
        graceful_shutdown_wait_loop_s=DRAIN_CHECK_S,
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )
    # given a class, serve.deployment returns a Deployment (Ray's types say a decorator)
    return cast(Deployment, deployment)
