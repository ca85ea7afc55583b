"""The engine's events of one request -> OpenAI's answer, whole or as server-sent chunks, for
completions and chat alike: the endpoint's shape (completions.CompletionShape, chat.ChatShape)
writes each choice, this writes the envelope (`id`, `object`, `created`, `model`), `usage`, and
the order of events. No server here.

`usage` counts each prompt once (a list of prompts: all of them; `n` answers of one prompt share
it) and every token of every answer, as OpenAI and vLLM count them. A stream that fails after its
first token ends with one OpenAI error event, then `data: [DONE]`. An answer is held to
`max_bytes` (`aotc serve --max-answer-mb`) while it is made: past it, a whole answer is a 400 and
a stream ends with that error event; either way the request's rows are freed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.serve.completions import DONE_EVENT, sse_event
from aotc_runtime.serve.protocol import DEFAULT_MAX_ANSWER_BYTES, RequestError, answer_too_large


@dataclass(frozen=True)
class Envelope:
    """What every chunk of one answer repeats."""

    object: str
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def body(self, choices: list, **more: Any) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model, "choices": choices, **more}  # fmt: skip


def envelope(shape: Any, model: str, chunks: bool) -> Envelope:
    kind = shape.chunk_object if chunks else shape.object
    return Envelope(kind, model, f"{shape.id_prefix}{uuid.uuid4().hex}")


def usage(request: Any, completion_tokens: int, cached: dict) -> dict:
    """OpenAI's usage: each prompt counted once (the first of its `n` answers), and of its tokens
    those a row of the KV cache already held (`cached`: choice index -> the count its first event
    gave), as `prompt_tokens_details.cached_tokens`."""
    firsts = [choice for choice in request.choices if choice.index % request.decoding.n == 0]
    prompt_tokens = sum(len(choice.request.prompt) for choice in firsts)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": sum(cached.get(choice.index, 0) for choice in firsts)
        },
    }


@dataclass
class Made:
    """What one choice has made so far."""

    texts: list = field(default_factory=list)
    ids: list = field(default_factory=list)
    events: list = field(default_factory=list)
    finish: FinishReason = FinishReason.LENGTH  # the engine's, from the choice's last event
    cached: int = 0  # its prompt's tokens the KV cache held (the first event says)


async def whole_answer(
    events: AsyncIterator,
    request: Any,
    shape: Any,
    model: str,
    max_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> dict:
    """Every event of the request, collected into one answer; a failure raises its RequestError."""
    made = {choice.index: Made() for choice in request.choices}
    size = 0
    async for item in events:
        for event in item["events"]:
            if "error" in event:
                raise RequestError(event["error"], event["message"])
            size += event_size(event)
            if size > max_bytes:
                raise answer_too_large(max_bytes)
            mine = made[event["index"]]
            mine.cached = event.get("cached_tokens", mine.cached)
            mine.texts.append(event["text"])
            mine.ids.extend(event["token_ids"])
            mine.events.append(event)
            mine.finish = event["finish_reason"] or mine.finish
    choices = [
        shape.whole_choice(choice, "".join(m.texts), m.ids, m.events, m.finish)
        for choice, m in ((choice, made[choice.index]) for choice in request.choices)
    ]
    total = sum(len(m.ids) for m in made.values())
    cached = {index: m.cached for index, m in made.items()}
    return envelope(shape, model, chunks=False).body(choices, usage=usage(request, total, cached))


def event_size(event: dict) -> int:
    """About the bytes an engine event takes in an answer: its text, and each logprob's token."""
    tops = event.get("top_logprobs") or ()
    return 64 + 2 * len(event["text"]) + sum(64 + len(str(top)) for top in tops)


async def server_sent(
    events: AsyncIterator,
    request: Any,
    shape: Any,
    model: str,
    max_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    errors: list | None = None,
) -> AsyncIterator[bytes]:
    """The request's chunks as server-sent events, then the usage chunk if asked, then [DONE].
    The error a stream ends with is also added to `errors` (a RequestError), for the request's
    log line."""
    answer = envelope(shape, model, chunks=True)
    by_index = {choice.index: choice for choice in request.choices}
    started: set = set()
    extra = {"usage": None} if request.decoding.include_usage else {}
    total, size = 0, 0
    failure: RequestError | None = None
    cached: dict = {}
    async for item in events:
        sent = []
        for event in item["events"]:
            if "error" in event:
                failure = RequestError(event["error"], event["message"])
                sent.append(sse_event(failure.body()))
                break
            index = event["index"]
            if "cached_tokens" in event:
                cached[index] = event["cached_tokens"]
            choices = shape.chunk_choices(by_index[index], event, index not in started)
            started.add(index)
            total += len(event["token_ids"])
            sent.append(sse_event(answer.body(choices, **extra)))
        data = b"".join(sent)  # one write for what came together
        size += len(data)
        if size > max_bytes and failure is None:
            failure = answer_too_large(max_bytes)
            data = sse_event(failure.body())
        if failure is not None and errors is not None:
            errors.append(failure)
        yield data
        if failure is not None:
            break  # the caller closes the engine's events: the request's rows are freed
    if request.decoding.include_usage and failure is None:
        yield sse_event(answer.body([], usage=usage(request, total, cached)))
    yield DONE_EVENT
