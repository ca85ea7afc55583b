"""One line per request of `aotc serve`, in the terminal that runs it.

    POST /v1/chat/completions 200 prompt=412 cached=384 completion=64 ttft=38ms 51.2 tok/s 1.29s
    POST /v1/completions 200 stream prompt=3 completion=5 ttft=21ms 88.0 tok/s 70ms (client disconnected)
    POST /v1/completions 400 param=temperature 4.1ms
    POST /v1/completions 404 code=model_not_found param=model 3.0ms

The endpoint and HTTP status; `stream` for server-sent events; the usage the answer reports
(`cached` only when the prefix cache reused some of the prompt); the time from the request's
arrival to its first token; the tokens per second after each answer's first token; the total
time; and why a request ended early, in parentheses. A refusal gives its `code` and `param`, as
its body does. A stream is logged when it ends. Successful GETs of /v1/health, /v1/models and
/v1/metadata are not logged (monitors poll them).

Where the lines go: the replicas answer in processes of Ray's, whose logging goes to Ray's log
files, and `aotc serve` starts Ray with `log_to_driver` off (it would bring every Ray process's
output to the terminal). So each replica hands its lines to a small actor that `aotc serve` owns
(RequestLogSink), and `aotc serve` takes them from it and logs them, on the logger
"aotc.serve.requests", in its own process: the terminal where it was started, on a cluster too.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aotc_runtime.serve.answers import usage
from aotc_runtime.serve.protocol import RequestError

LOGGER_NAME = "aotc.serve.requests"
logger = logging.getLogger(LOGGER_NAME)

SINK_NAMESPACE = "aotc"
# the routes a monitor polls: a 200 there is not logged
POLLED = ("GET /v1/health", "GET /v1/models", "GET /v1/metadata")
TAKE_WAIT_S = 0.5  # how long one take waits for a line: `aotc serve` stops within about this
MAX_HELD = 10_000  # lines the sink holds for `aotc serve`; past it the oldest are dropped


class Tally:
    """The engine's items of one request (runtime/aotc_runtime/serve/completion_engine.py), passed
    on as they come and counted: the usage the answer reports, and when its first and last tokens
    came."""

    def __init__(self, events: Any):
        self._events = events
        self.request: Any = None  # the parsed request, once accepted
        self.tokens = 0
        self.cached: dict = {}  # choice index -> prompt tokens the cache held
        self.answers: set = set()  # choices that made a token
        self.first: float | None = None
        self.last: float | None = None

    def __aiter__(self) -> Tally:
        return self

    async def __anext__(self) -> dict:
        item = await self._events.__anext__()
        self.request = item.get("request", self.request)
        for event in item.get("events", ()):
            if "error" in event:
                continue
            self.tokens += len(event["token_ids"])
            self.answers.add(event["index"])
            if "cached_tokens" in event:
                self.cached[event["index"]] = event["cached_tokens"]
            made = event["time"] if "time" in event else time.perf_counter()  # when it was made
            self.first = made if self.first is None else self.first
            self.last = made
        return item

    async def aclose(self) -> None:
        await self._events.aclose()

    def usage(self) -> dict | None:
        """OpenAI's usage of what was made so far, as the answer counts it (None: not accepted)."""
        return None if self.request is None else usage(self.request, self.tokens, self.cached)

    def tokens_per_second(self) -> float | None:
        """The tokens after each answer's first, over the time from the first token to the last
        (the decode rate; None before a second token)."""
        after_first = self.tokens - len(self.answers)
        if self.first is None or self.last is None or after_first < 1 or self.last <= self.first:
            return None
        return after_first / (self.last - self.first)


@dataclass
class RequestRecord:
    """What one request's line says; `route` (runtime/aotc_runtime/serve/ingress.py) makes it, the
    handler adds what it knows."""

    endpoint: str  # "POST /v1/completions"
    started: float = field(default_factory=time.perf_counter)
    status: int | None = None  # None: no answer was sent (the client left first)
    code: str | None = None
    param: str | None = None
    tally: Tally | None = None
    stream: bool = False  # a stream writes its line when it ends, not when its headers go
    ended: str | None = None  # why it ended early

    def refused(self, exc: RequestError) -> None:
        self.status, self.code, self.param = exc.status, exc.code, exc.param

    def polled(self) -> bool:
        return self.status == 200 and self.endpoint in POLLED

    def line(self) -> str:
        parts = [self.endpoint, "-" if self.status is None else str(self.status)]
        if self.stream:
            parts.append("stream")
        parts += [f"{key}={value}" for key, value in (("code", self.code), ("param", self.param))
                  if value is not None]  # fmt: skip
        tally = self.tally
        counted = tally.usage() if tally is not None else None
        if tally is not None and counted is not None:
            parts.append(f"prompt={counted['prompt_tokens']}")
            cached = counted["prompt_tokens_details"]["cached_tokens"]
            if cached:
                parts.append(f"cached={cached}")
            parts.append(f"completion={counted['completion_tokens']}")
            if tally.first is not None:
                parts.append(f"ttft={milliseconds(tally.first - self.started)}")
            rate = tally.tokens_per_second()
            if rate is not None:
                parts.append(f"{rate:.1f} tok/s")
        seconds = time.perf_counter() - self.started
        parts.append(f"{seconds:.2f}s" if seconds >= 1 else milliseconds(seconds))
        if self.ended:
            parts.append(f"({self.ended})")
        return " ".join(parts)


def milliseconds(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f}ms" if ms < 10 else f"{ms:.0f}ms"


class RequestLog:
    """Where a replica writes its requests' lines: its own logger, and the sink `aotc serve`
    reads (`sink_name`; None: no sink, as in-process).

    The lines go to the sink from a thread of this log's own, not from the request's task: a
    stream's line is written while its request is cancelled (its client left), and Ray cancels
    the tasks a cancelled task submitted with it, a line handed over from the request's task too."""

    def __init__(self, sink_name: str | None = None):
        self._sink: Any = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        if sink_name is not None:
            import ray

            # registered before `aotc serve` deploys anything (a named actor's creation registers
            # its name at once); a replica without it answers all the same
            try:
                self._sink = ray.get_actor(sink_name, namespace=SINK_NAMESPACE)
            except ValueError as exc:
                logging.getLogger("ray.serve").warning("no request log for aotc serve (%s)", exc)
            else:
                threading.Thread(target=self._send, name="aotc-request-log", daemon=True).start()

    def write(self, record: RequestRecord) -> None:
        if record.polled():
            return
        line = record.line()
        logger.info(line)
        if self._sink is not None:
            self._outbox.put(line)

    def _send(self) -> None:
        """Hand each line to the sink, in order; not waited for: answering never waits on a log."""
        while True:
            line = self._outbox.get()
            try:
                self._sink.put.remote(line)
            except Exception as exc:  # Ray's errors have no common base; answering goes on
                logging.getLogger("ray.serve").warning(
                    "request lines no longer reach aotc serve (%r)", exc
                )
                self._sink = None
                return


class RequestLogSink:
    """The replicas' request lines until `aotc serve` takes them (a Ray actor it owns)."""

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque()
        self._dropped = 0
        self._arrived = asyncio.Event()

    async def put(self, line: str) -> None:
        if len(self._lines) >= MAX_HELD:
            self._lines.popleft()
            self._dropped += 1
        self._lines.append(line)
        self._arrived.set()

    async def take(self, wait_s: float) -> list[str]:
        """The lines held, once there is one or `wait_s` has passed."""
        if not self._lines and wait_s > 0:
            try:
                await asyncio.wait_for(self._arrived.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        self._arrived.clear()
        lines = list(self._lines)
        self._lines.clear()
        if self._dropped:
            lines.append(f"({self._dropped} request lines dropped: aotc serve did not take them "
                         "in time)")  # fmt: skip
            self._dropped = 0
        return lines


class RequestLogFollower:
    """`aotc serve`'s side: the sink actor, and a thread that takes its lines and logs them on
    LOGGER_NAME in this process."""

    def __init__(self) -> None:
        import ray

        self.name = f"aotc-request-log-{uuid.uuid4().hex[:12]}"
        # Any: Ray's types give a handle's methods as the class's plain functions, without `.remote`
        self._sink: Any = (
            ray.remote(num_cpus=0)(RequestLogSink)
            .options(name=self.name, namespace=SINK_NAMESPACE)
            .remote()
        )
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Log from now on. What came before is dropped: `aotc serve`'s own requests checking
        that each route answers."""
        self._take(0)
        self._thread = threading.Thread(target=self._follow, name="aotc-request-log", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stopping.is_set():
            try:
                self._log(self._take(TAKE_WAIT_S))
            except Exception as exc:  # Ray going down, or the sink gone: the log ends, not serving
                if not self._stopping.is_set():
                    logger.warning("request lines stop here (%r)", exc)
                return

    def _take(self, wait_s: float) -> list[str]:
        import ray

        return ray.get(self._sink.take.remote(wait_s), timeout=wait_s + 30)

    @staticmethod
    def _log(lines: list[str]) -> None:
        for line in lines:
            logger.info(line)

    def stop(self) -> None:
        """The last lines (the replicas have finished what they answered), then the sink."""
        import ray

        self._stopping.set()
        if self._thread is not None:
            self._thread.join(TAKE_WAIT_S + 5)
        try:
            self._log(self._take(0))
            ray.kill(self._sink)
        except Exception as exc:  # Ray going down: the stop goes on (the sink ends with this job)
            logger.debug("request log: %r", exc)
