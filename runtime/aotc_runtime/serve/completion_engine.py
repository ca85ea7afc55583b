"""What generates the answers of `aotc serve` for a text-generation package: OpenAI completions
and chat completions, streamed token by token, every answer joining one running batch. The HTTP
side is runtime/aotc_runtime/serve/completion_server.py, in the same process (a token crosses no
process on its way).

`complete(body, chat=False)` is an async generator. Its first item is the refusal of the request
(`{"refused": RequestError}`: answered as JSON) or its acceptance (`{"accepted": True, "request":
the parsed request}`); then items `{"events": [...]}` holding one event per new token of any of its
answers, `{"index": choice, "token_ids": [id], "text": delta, "finish_reason": None | a
FinishReason, "logprob", "top_logprobs", "time"}` (the engine's Made as it came: an answer's last
event with its finish_reason, STOP or LENGTH, which json writes "stop" or "length"; its first with
"cached_tokens", its prompt's tokens a row of the cache already held; "time" the perf_counter when
it was made): as many as were made since the previous item was taken, until every answer has
finished. A request the package failed on (an answer whose finish is ERROR among them) ends with
`{"error": 500, "message": ...}` instead.

Batching: the package holds one KV cache of B rows (`aotc export --batch-size B`). Every answer a
request asks for (a prompt of a list, one of `n`) is one sequence in the runtime's decode engine
(continuous batching, aotc_runtime/decode_engine.py): a sequence that waits joins at the next step
if a row is free and the row's cache holds its prompt and max_tokens, and leaves at its own
max_tokens, end-of-sequence or stop string (the engine decides, and gives each token's text); each
row is answered as if alone, greedy or sampled (a seed gives the same tokens whatever the
neighbours). A client that disconnects marks its sequences gone; their rows are freed at the next
step. With the prefix cache on (the default), a joining sequence whose prompt starts as a row
holds (a chat's earlier turns, a shared system prompt) is fed only the rest
(aotc_runtime/prefix_cache.py); one cache lives as long as the replica.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ray.serve import metrics

from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.prefix_cache import PrefixCache
from aotc_runtime.serve.chat import ChatRequest, parse_chat
from aotc_runtime.serve.completions import CompletionRequest, parse_completion
from aotc_runtime.serve.protocol import RequestError, said_whole
from aotc_runtime.serve.replica import REFUSED, ReplicaSettings, refusal_reason
from aotc_runtime.serve.request_fields import Choice, shown_name
from aotc_runtime.serve.shipping import PackageSource, load_package, release_when_read

logger = logging.getLogger("ray.serve")

# The generating thread releases the GIL at every torch operation, dozens a step; each time the
# event loop may take it and, while busy, keep it for Python's switch interval (5 ms by default),
# so a step could wait milliseconds on the loop. A shorter interval bounds that wait.
SWITCH_INTERVAL_S = 0.0005

# What a request hears when the package's logits for one of its answers are not finite (the other
# requests' rows go on: aotc_runtime/decode_engine.py ends that row alone)
NON_FINITE_MESSAGE = (
    "the model's logits for this request were not finite (NaN or infinite): its weights, its "
    "dtype's range or this prompt; the request was ended, other requests go on"
)

TTFT_BUCKETS_MS: list[float] = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]


@dataclass
class Reply:
    """Where one request's events go: from the thread that generates to the event loop that
    answers it, in order."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    gone: bool = False  # the client left (set on the event loop, read by the generating thread)

    def send(self, event: dict) -> None:
        """From the generating thread: the event reaches the request's loop in order."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class Job:
    """One answer of a request (a row's work), waiting or generating."""

    choice: Choice
    reply: Reply
    arrived: float = field(default_factory=time.perf_counter)
    finished: bool = False

    @property
    def gone(self) -> bool:
        return self.reply.gone

    def send(self, event: dict) -> None:
        self.reply.send(event)


class Answer:
    """What an answer has been given so far: its count of tokens, and how many of its prompt's
    tokens a row of the cache already held."""

    def __init__(self, job: Job):
        self.job, self.made, self.cached = job, 0, 0


class CompletionEngine:
    """One replica's package, its waiting requests, and the worker that generates for them. A
    package that cannot load here is reported (health, and a 503 per request), not raised: a
    failing constructor would make Ray retry the replica in a loop."""

    def __init__(self, source: PackageSource, settings: ReplicaSettings, served_name: str):
        import torch

        self._source, self._folder = source, None
        self.package: Any = None
        self.refused: str | None = None
        self.chat_template: Any = None  # aotc_runtime.chat_template.ChatTemplate, if it has one
        self._id = uuid.uuid4().hex[
            :12
        ]  # tells replicas apart on /v1/health, and says nothing else
        self._served = served_name
        try:
            self._folder = source.materialize()
            self.package = load_package(self._folder, settings.public_key_pem)
            self.generation = self.package.generation
            # read now, from the files load() just checked (against the signature, when asked)
            self.tokenizer = self.package.tokenizer if self.generation.tokenizer else None
            from aotc_runtime.chat_template import ChatTemplate

            self.chat_template = ChatTemplate.of_package(self.package)
        except Exception as exc:  # every reason a package cannot load here is reported, not raised
            self.refused = refusal_reason(exc)
            logger.error(self.refused)
        finally:
            release_when_read(source, self._folder)
        import sys

        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._executor = ThreadPoolExecutor(
            max_workers=1, initializer=torch.set_num_threads, initargs=(settings.threads,)
        )
        self._pending: collections.deque[Job] = collections.deque()
        # the event loop adds and drops waiting answers while the package's thread picks among
        # them: every look at the queue that runs Python code per item holds this (a scan
        # interleaved with an append raised "deque mutated during iteration" under 50 requests)
        self._pending_lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self.counts = {"requests": 0, "generations": 0, "tokens": 0}
        self.prefix_cache = PrefixCache() if settings.prefix_cache else None
        self._vocabulary: Any = None  # the tokenizer as grammars read it, made at first use
        self._vocabulary_lock = threading.Lock()
        self._ttft = metrics.Histogram(
            "aotc_time_to_first_token_ms",
            description="From a completion request's arrival at its replica to its first token.",
            boundaries=TTFT_BUCKETS_MS,
        )
        self._tokens = metrics.Counter(
            "aotc_generated_tokens", description="Tokens generated (rate: tokens per second)."
        )
        self._active = metrics.Gauge(
            "aotc_active_sequences", description="Sequences generating now."
        )
        self._queued = metrics.Gauge(
            "aotc_queued_requests", description="Completion requests waiting for the package."
        )

    async def complete(self, body: bytes, chat: bool = False) -> AsyncIterator[dict]:
        """The request's refusal or acceptance, then its events (see the module's text); `chat`:
        a chat completion's body, else a completion's."""
        if self.refused is not None:
            yield {"refused": RequestError(503, REFUSED)}
            return
        try:
            # off the event loop: a chat template renders in its own process (up to its
            # deadline), and a prompt's tokenizing grows with its text; streams and health
            # checks go on meanwhile
            request: ChatRequest | CompletionRequest
            if chat:
                request = await asyncio.to_thread(
                    parse_chat,
                    body,
                    self.generation,
                    self.tokenizer,
                    self.chat_template,
                    self.vocabulary,
                )
            else:
                request = await asyncio.to_thread(
                    parse_completion, body, self.generation, self.tokenizer
                )
            if request.decoding.model not in (None, self._served):
                raise RequestError(
                    404,
                    f"model {shown_name(request.decoding.model)} is not served here; use '{self._served}'",
                    param="model",
                    code="model_not_found",
                )
        except RequestError as exc:
            yield {"refused": exc}
            return
        reply = Reply(asyncio.get_running_loop(), asyncio.Queue())
        self._start_worker()
        jobs = [Job(choice, reply) for choice in request.choices]
        with self._pending_lock:
            self._pending.extend(jobs)
        self._queued.set(len(self._pending))
        assert self._wake is not None
        self._wake.set()
        self.counts["requests"] += 1
        yield {"accepted": True, "request": request}
        unfinished = len(request.choices)
        try:
            while True:
                # every token waiting goes in one item: a client slower than the model gets
                # them in one write
                events = [await reply.events.get()]
                while not reply.events.empty():
                    events.append(reply.events.get_nowait())
                yield {"events": events}
                if any("error" in event for event in events):
                    return
                unfinished -= sum(event["finish_reason"] is not None for event in events)
                if unfinished == 0:
                    return
        finally:  # answered, or the client left (the stream was cancelled)
            reply.gone = True

    def vocabulary(self) -> Any:
        """The package's aotc_runtime.token_grammar.Vocabulary, made when a request first asks
        for a JSON schema or tools (about half a second; requests parse in threads: made once)."""
        with self._vocabulary_lock:
            if self._vocabulary is None:
                from aotc_runtime.token_grammar import Vocabulary

                self._vocabulary = Vocabulary(
                    self.tokenizer, self.generation.vocab_size, self.generation.eos_token_ids
                )
            return self._vocabulary

    def _start_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def _work(self) -> None:
        """Runs the package for what waits: a running batch that takes each new request at its
        next step."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            with self._pending_lock:
                while self._pending and self._pending[0].gone:
                    self._pending.popleft()
            self._queued.set(len(self._pending))
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            await loop.run_in_executor(self._executor, self._run_batch)

    def _admit(self, batch: Any, rows: dict) -> None:
        """In the package's thread: waiting answers join the running batch while they fit. Each
        free row goes to the request that holds the fewest rows now, the first to arrive among
        equals: a request's `n` answers take turns with the requests behind them, so a small
        request waits for one row to free, not for a large request's every answer."""
        held = collections.Counter(id(answer.job.reply) for answer in rows.values())
        while True:
            with self._pending_lock:  # chosen and taken off the queue in one hold
                for gone in [job for job in self._pending if job.gone]:
                    self._pending.remove(gone)
                if not self._pending:
                    return
                job = min(self._pending, key=lambda each: held[id(each.reply)])  # the earliest
                request = job.choice.request  # checked against the package when parsed
                if not batch.has_free_row:
                    return  # the chosen answer waits for a row; none overtakes it
                if batch.waits_for_prefix(request.prompt):
                    return  # a row is being fed its prompt's start: it joins once it can copy it
                self._pending.remove(job)
            rows[id(job)] = answer = Answer(job)  # first: a failing join is told to it
            answer.cached = batch.join(id(job), request)
            held[id(job.reply)] += 1

    def _deliver(self, answer: Answer, made: Any) -> None:
        """One new token of an answer (decode_engine.Made: the token, its text, whether it ended
        the answer, which the engine decides, and its logprobs when asked), sent to its client;
        its time to first token."""
        answer.made += 1
        job = answer.job
        if answer.made == 1:
            self._ttft.observe((time.perf_counter() - job.arrived) * 1000)
        job.finished = made.finish is not None
        if made.finish is FinishReason.ERROR:  # its logits were not finite: its request fails alone
            if not job.gone:
                job.send({"error": 500, "message": NON_FINITE_MESSAGE})
            return
        if not job.gone:
            event = {
                "index": job.choice.index,
                "token_ids": [made.token],
                "text": made.text,
                "finish_reason": made.finish,
                "logprob": made.logprob,
                "top_logprobs": made.top_logprobs,
                "time": time.perf_counter(),  # when it was made (the request's log line)
            }
            if answer.made == 1:
                event["cached_tokens"] = answer.cached
            job.send(event)

    def _count_step(self, answers: Iterable[Answer]) -> None:
        live = sum(1 for answer in answers if not answer.job.gone)
        if live:
            self._tokens.inc(live)
            self.counts["tokens"] += live

    @staticmethod
    def _fail(answers: Iterable[Answer], exc: Exception) -> None:
        """The package failed: every request still waiting hears why."""
        said = said_whole(str(exc))
        message = f"the model failed on this request: {type(exc).__name__}" + (
            f": {said}" if said else ""
        )
        for answer in answers:
            if not answer.job.finished:
                answer.job.send({"error": 500, "message": message})

    def _run_batch(self) -> None:
        """In the package's thread: the requests in one decode engine (continuous batching,
        aotc_runtime/decode_engine.py), each token sent as it comes, until no request is left."""
        batch = None
        rows: dict = {}  # row key -> its request's Answer
        self.counts["generations"] += 1
        try:
            from aotc_runtime.decode_engine import DecodeEngine

            batch = DecodeEngine(
                self.package, tokenizer=self.tokenizer, prefix_cache=self.prefix_cache
            )
            while True:
                self._admit(batch, rows)
                self._queued.set(len(self._pending))
                self._active.set(len(rows))
                if not rows:
                    return
                for made in batch.step():
                    self._deliver(rows[made.key], made)
                self._count_step(rows.values())
                for key, answer in list(rows.items()):
                    if answer.job.finished or answer.job.gone:  # its row is free for the next
                        batch.leave(key)  # (already free when the engine ended it)
                        del rows[key]
        except Exception as exc:
            if not rows and self._pending:
                # it failed before any request joined: the first waiting one hears why (left
                # waiting, it would be tried again and again, and never answered)
                with self._pending_lock:
                    rows[None] = Answer(self._pending.popleft())
            self._fail(rows.values(), exc)
        finally:
            if batch is not None:
                batch.release()
            self._active.set(0)

    def health(self) -> dict:
        """What /v1/health tells anyone who asks: ready or not, and how busy."""
        return {
            "status": "refused" if self.refused else "ok",
            "model": self._served,
            "replica": self._id,
            "waiting": len(self._pending),
            **self.counts,
            # prompt tokens not fed again, over the replica's life (None: the cache is off)
            "prefix_reused_tokens": (
                self.prefix_cache.reused_tokens if self.prefix_cache is not None else None
            ),
        }
