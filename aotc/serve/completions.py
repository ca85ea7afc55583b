"""The OpenAI completions protocol of `aotc serve` for text-generation packages (issue 27): a
request body -> what to generate, checked against the package; the tokens -> a response body or
server-sent events. No server and no model here, so every check is tested without one.

`POST /v1/completions`, a subset of OpenAI's (served by aotc/serve/completion_server.py with
aotc/serve/completion_engine.py; the protocol is tested on its own here):
- `prompt`: text (with the package's tokenizer) or a list of token ids; `max_tokens` (16);
  `temperature` (1.0, as OpenAI's: 0 is greedy); `top_p` (1.0); `seed`; `stop`: a string or a list of
  up to 4 (text only); `stream`; `model` (any string: a server serves one package).
- Fields OpenAI defines that this server does not implement are accepted only at their neutral
  value (`n` 1, `echo` false, `logprobs` null, `best_of` 1, penalties 0, `suffix` null, `user`):
  clients that always send them work, and a request that needs one is refused rather than answered
  as if it had not asked. Any other field is refused, naming it.
- The answer: {"id", "object": "text_completion", "created", "model", "choices": [{"index": 0,
  "text", "token_ids", "finish_reason": "length" | "stop", "logprobs": null}], "usage":
  {"prompt_tokens", "completion_tokens", "total_tokens"}}; `token_ids` is aotc's addition (with
  the end-of-sequence token when one ended the text, as `aotc generate` lists it). Streamed:
  `data: {chunk}` events with the new text and token ids, the last with its finish_reason, then
  `data: [DONE]`.

Every refusal is a protocol.RequestError (400, or 413 for a body above the limit) with one line
that says what to send instead; the package's own limits (the vocabulary, the cache) use the
runtime's words (aotc_runtime/generation.py check_request).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aotc.serve.protocol import RequestError

DEFAULTS = {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0}
# OpenAI's fields this server leaves out, and the value each may still carry
NEUTRAL = {
    "n": 1,
    "best_of": 1,
    "echo": False,
    "logprobs": None,
    "suffix": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
    "stream_options": None,
}
FIELDS = ("prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "model", "user")
MAX_STOP = 4  # OpenAI's limit on stop sequences
# bytes of a request beyond its prompt: every other field at its longest, with room to spare
BODY_ALLOWANCE = 16 << 10


@dataclass(frozen=True)
class CompletionRequest:
    prompt_ids: list
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple
    stream: bool
    model: str | None

    def sampling(self) -> dict:
        """The keyword arguments of Package.generate / stream that pick tokens as asked."""
        return {
            "temperature": self.temperature,
            "top_p": None if self.top_p == 1.0 else self.top_p,
            "seed": self.seed,
        }


def max_body_bytes(max_seq_len: int) -> int:
    """The largest completion body worth reading: the longest prompt the cache holds, as ids (up to
    11 bytes each with a comma) or as text (a token is rarely above 64 bytes of UTF-8), plus the
    other fields. Anything larger is refused before json.loads makes objects of it."""
    return BODY_ALLOWANCE + 64 * max_seq_len


def parse_completion(body: bytes, generation: Any, tokenizer: Any = None) -> CompletionRequest:
    """The request in `body`, checked against the package's `generation` (aotc_runtime's
    Generation); `tokenizer` (a tokenizers.Tokenizer) when the package carries one."""
    limit = max_body_bytes(generation.max_seq_len)
    if len(body) > limit:
        raise RequestError(
            413,
            f"request body is {len(body)} bytes, above the {limit} a prompt of at most "
            f"{generation.max_seq_len} tokens needs; send a shorter prompt",
        )
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"request body is not JSON ({exc}); send a JSON object") from None
    except RecursionError:  # json.loads recurses once per level: a body of "[[[[..." stops it
        raise RequestError(
            400, "request body nests too deeply to be a completion; send a flat JSON object"
        ) from None
    if not isinstance(data, dict):
        raise RequestError(400, 'request body is not a JSON object; send {"prompt": ...}')
    for key, value in data.items():
        if key in NEUTRAL:
            if value != NEUTRAL[key]:
                raise RequestError(
                    400,
                    f"'{key}' is {json.dumps(value)[:40]}; this server supports only "
                    f"{json.dumps(NEUTRAL[key])} (leave it out)",
                )
        elif key not in FIELDS:
            raise RequestError(
                400, f"unknown field '{key}'; a completion takes {', '.join(FIELDS)}"
            )
    if "prompt" not in data:
        raise RequestError(400, "'prompt' is missing; send text or a list of token ids")
    stop = _stop(data.get("stop"), tokenizer)
    request = CompletionRequest(
        prompt_ids=_prompt_ids(data["prompt"], generation, tokenizer),
        max_tokens=_integer(data, "max_tokens", DEFAULTS["max_tokens"], low=1),
        temperature=_number(data, "temperature", DEFAULTS["temperature"], low=0.0, high=2.0),
        top_p=_number(data, "top_p", DEFAULTS["top_p"], low=0.0, high=1.0, open_low=True),
        seed=_integer(data, "seed", None, low=0) if data.get("seed") is not None else None,
        stop=stop,
        stream=_boolean(data, "stream", False),
        model=_text(data, "model"),
    )
    _fits(request, generation)
    return request


def _prompt_ids(prompt: Any, generation: Any, tokenizer: Any) -> list:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RequestError(
                400,
                "'prompt' is text, but this package carries no tokenizer; send a list of token "
                "ids, or export it with --tokenizer DIR",
            )
        ids = tokenizer.encode(prompt).ids
    elif isinstance(prompt, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in prompt
    ):
        ids = list(prompt)
    else:
        raise RequestError(
            400,
            "'prompt' must be text or a list of token ids (one prompt per request); got "
            f"{type(prompt).__name__}",
        )
    if not ids:
        raise RequestError(400, "the prompt is empty; give at least one token")
    return ids


def _fits(request: CompletionRequest, generation: Any) -> None:
    """The runtime's own check of the prompt (its vocabulary) and max_tokens (the cache), as a 400
    in the runtime's words."""
    import torch

    from aotc_runtime.errors import GenerationInputError
    from aotc_runtime.generation import GREEDY, check_request

    ids = torch.tensor([request.prompt_ids], dtype=torch.int64)
    try:
        check_request(generation, ids, None, request.max_tokens, GREEDY)
    except GenerationInputError as exc:
        raise RequestError(400, str(exc)) from None


def _stop(value: Any, tokenizer: Any) -> tuple:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(400, "'stop' must be a non-empty string or a list of them")
    if len(stops) > MAX_STOP:
        raise RequestError(400, f"'stop' holds {len(stops)} strings; send at most {MAX_STOP}")
    if tokenizer is None:
        raise RequestError(
            400, "'stop' needs text, but this package carries no tokenizer; leave 'stop' out"
        )
    return tuple(stops)


def _integer(data: dict, key: str, default: Any, low: int) -> Any:
    value = data.get(key, default)
    if value is None and default is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise RequestError(
            400, f"'{key}' must be a whole number >= {low}; got {json.dumps(value)[:40]}"
        )
    return value


def _number(
    data: dict, key: str, default: float, low: float, high: float, open_low: bool = False
) -> float:
    value = data.get(key, default)
    inside = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (value > low if open_low else value >= low)
        and value <= high
    )
    if not inside:
        bounds = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise RequestError(
            400, f"'{key}' must be a number in {bounds}; got {json.dumps(value)[:40]}"
        )
    return float(value)


def _boolean(data: dict, key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise RequestError(400, f"'{key}' must be true or false; got {json.dumps(value)[:40]}")
    return value


def _text(data: dict, key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise RequestError(400, f"'{key}' must be a string; got {json.dumps(value)[:40]}")
    return value


def cut_at_stop(text: str, stop: tuple) -> tuple[str, bool]:
    """`text` up to the first stop string in it (which is left out, as OpenAI leaves it out), and
    whether one was found."""
    found = [text.find(s) for s in stop if s in text]
    return (text[: min(found)], True) if found else (text, False)


def completion_body(
    request_id: str,
    model: str,
    created: int,
    text: str | None,
    token_ids: list,
    finish_reason: str,
    prompt_tokens: int,
) -> dict:
    """The whole answer of a request that did not stream: one chunk with all of it, and usage."""
    body = chunk_body(request_id, model, created, text or "", token_ids, finish_reason)
    body["usage"] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(token_ids),
        "total_tokens": prompt_tokens + len(token_ids),
    }
    return body


def chunk_body(
    request_id: str,
    model: str,
    created: int,
    text: str,
    token_ids: list,
    finish_reason: str | None = None,
) -> dict:
    """One streamed event: the text and token ids new since the last one."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "token_ids": list(token_ids),
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
    }


DONE_EVENT = b"data: [DONE]\n\n"


def sse_event(data: dict) -> bytes:
    """One server-sent event carrying `data` as JSON (one line: JSON escapes newlines)."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
