"""The OpenAI completions protocol of `aotc serve` for text-generation packages: a
request body -> what to generate, checked against the package; the tokens -> a response body or
server-sent events. No server and no model here, so every check is tested without one.

`POST /v1/completions`, a subset of OpenAI's (served by aotc/serve/completion_server.py with
aotc/serve/completion_engine.py; the protocol is tested on its own here):
- `prompt`: text (with the package's tokenizer) or a list of token ids; `max_tokens` (16);
  `temperature` (1.0, as OpenAI's: 0 is greedy); `top_p` (1.0); `top_k` (none; vLLM's and
  llama.cpp's servers take it too, as `aotc generate --top-k` does); `seed`; `stop`: a string or a list of
  up to 4 (text only); `stream`; `model` (any string: a server serves one package).
- temperature, top_p, top_k and seed accept what `aotc generate`, the Python API and the C++ runner accept
  (aotc_runtime.sampling: temperature 0 or 0.01 to 100, top_p 1e-6 to 1, seed 0 to 2**64-1), one
  definition for all of them; a boolean is not a number.
- An explicit null in any field but `prompt` means its default, as OpenAI reads it.
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
that says what to send instead, and the field at fault as its `param`; the package's own limits
(the vocabulary, the cache) use the runtime's words (aotc_runtime/generation.py check_request).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aotc.serve.protocol import RequestError

if TYPE_CHECKING:
    from aotc_runtime.sampling import Sampling

DEFAULTS = {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0}
# OpenAI's fields this server leaves out, and the value each may still carry (or null)
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
FIELDS = ("prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "model",
          "user")  # fmt: skip
MAX_STOP = 4  # OpenAI's limit on stop sequences
# bytes of a request beyond its prompt: every other field at its longest, with room to spare
BODY_ALLOWANCE = 16 << 10
MAX_TOKEN_ID = 2**63 - 1  # ids travel as int64: a larger one is no token of any vocabulary


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
    top_k: int | None = None

    def sampling(self) -> Sampling:
        """How the runtime picks this request's tokens."""
        from aotc_runtime.sampling import Sampling  # torch: imported where a model runs

        top_p = None if self.top_p == 1.0 else self.top_p
        return Sampling(self.temperature, self.top_k, top_p, self.seed)


def max_body_bytes(max_seq_len: int) -> int:
    """The largest completion body worth reading: the longest prompt the cache holds, as ids (up to
    11 bytes each with a comma) or as text (a token is rarely above 64 bytes of UTF-8), plus the
    other fields. Anything larger is refused before json.loads makes objects of it."""
    return BODY_ALLOWANCE + 64 * max_seq_len


def body_too_large_for_prompt(size: int | str, limit: int, max_seq_len: int) -> RequestError:
    """413 for a body above what the package's longest prompt needs: no server flag raises that
    limit, only a shorter prompt or a package with a longer cache."""
    return RequestError(
        413,
        f"request body is {size} bytes, above the {limit} a prompt of at most {max_seq_len} "
        "tokens (this package's cache) needs; send a shorter prompt, or serve a package exported "
        "with a larger --max-seq-len",
        param="prompt",
        code="request_too_large",
    )


def parse_completion(body: bytes, generation: Any, tokenizer: Any = None) -> CompletionRequest:
    """The request in `body`, checked against the package's `generation` (aotc_runtime's
    Generation); `tokenizer` (a tokenizers.Tokenizer) when the package carries one."""
    limit = max_body_bytes(generation.max_seq_len)
    if len(body) > limit:
        raise body_too_large_for_prompt(len(body), limit, generation.max_seq_len)
    data = _json_object(body)
    _check_fields(data)
    if data.get("prompt") is None:
        raise RequestError(
            400, "'prompt' is missing; send text or a list of token ids", param="prompt"
        )
    stop = _stop(data.get("stop"), tokenizer)
    request = CompletionRequest(
        prompt_ids=_prompt_ids(data["prompt"], generation, tokenizer),
        max_tokens=_integer(data, "max_tokens", DEFAULTS["max_tokens"], low=1),
        temperature=_sampling(data, "temperature", DEFAULTS["temperature"]),
        top_p=_sampling(data, "top_p", DEFAULTS["top_p"]),
        top_k=_sampling(data, "top_k", None),
        seed=_sampling(data, "seed", None),
        stop=stop,
        stream=_boolean(data, "stream", False),
        model=_text(data, "model"),
    )
    _text(data, "user")
    _fits(request, generation)
    return request


def _json_object(body: bytes) -> dict:
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
    return data


def _check_fields(data: dict) -> None:
    for key, value in data.items():
        if key in NEUTRAL:
            if value is not None and value != NEUTRAL[key]:
                raise RequestError(
                    400,
                    f"'{key}' is {_shown(value)}; this server supports only "
                    f"{json.dumps(NEUTRAL[key])} (leave it out)",
                    param=key,
                )
        elif key not in FIELDS:
            raise RequestError(
                400,
                f"unknown field '{key[:40]}'; a completion takes {', '.join(FIELDS)}",
                param=key,
            )


def _shown(value: Any) -> str:
    """A value as JSON, short and on one line, whatever a client sent (ASCII: a lone surrogate
    becomes its escape instead of failing to encode)."""
    return json.dumps(value)[:40]


def _prompt_ids(prompt: Any, generation: Any, tokenizer: Any) -> list:
    if isinstance(prompt, str):
        ids = _encode(prompt, tokenizer)
    elif isinstance(prompt, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in prompt
    ):
        ids = list(prompt)
        # before any tensor is made of them: torch cannot hold an id beyond int64
        bad = next((i for i in ids if not 0 <= i <= MAX_TOKEN_ID), None)
        if bad is not None:
            raise RequestError(
                400,
                f"token id {_shown(bad)} is outside the vocabulary (0..{generation.vocab_size - 1})",
                param="prompt",
            )
    else:
        raise RequestError(
            400,
            "'prompt' must be text or a list of token ids (one prompt per request); got "
            f"{type(prompt).__name__}",
            param="prompt",
        )
    if not ids:
        raise RequestError(400, "the prompt is empty; give at least one token", param="prompt")
    return ids


def _encode(prompt: str, tokenizer: Any) -> list:
    if tokenizer is None:
        raise RequestError(
            400,
            "'prompt' is text, but this package carries no tokenizer; send a list of token "
            "ids, or export it with --tokenizer DIR",
            param="prompt",
        )
    _check_unicode(prompt, "prompt")
    return tokenizer.encode(prompt).ids


def _check_unicode(text: str, key: str) -> None:
    """JSON may carry a lone surrogate ("\\ud800"), which is no character: the tokenizer cannot
    take it (it raised, and the client got a plain-text 500)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(
            400,
            f"'{key}' holds a lone UTF-16 surrogate ({_shown(text[exc.start])} at character "
            f"{exc.start}), which is not text; send valid Unicode (a surrogate pair, or UTF-8)",
            param=key,
        ) from None


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
        param = "prompt" if str(exc).startswith("token id") else "max_tokens"
        raise RequestError(400, str(exc), param=param) from None


def _stop(value: Any, tokenizer: Any) -> tuple:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(400, "'stop' must be a non-empty string or a list of them", param="stop")
    if len(stops) > MAX_STOP:
        raise RequestError(
            400, f"'stop' holds {len(stops)} strings; send at most {MAX_STOP}", param="stop"
        )
    if tokenizer is None:
        raise RequestError(
            400,
            "'stop' needs text, but this package carries no tokenizer; leave 'stop' out",
            param="stop",
        )
    for text in stops:
        _check_unicode(text, "stop")
    return tuple(stops)


def _value(data: dict, key: str, default: Any) -> Any:
    """The field's value; absent or null (OpenAI's nullable fields) -> its default."""
    value = data.get(key)
    return default if value is None else value


def _integer(data: dict, key: str, default: Any, low: int) -> Any:
    value = _value(data, key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise RequestError(
            400, f"'{key}' must be a whole number >= {low}; got {_shown(value)}", param=key
        )
    return value


def _sampling(data: dict, key: str, default: Any) -> Any:
    """temperature, top_p, top_k or seed, checked by aotc_runtime.sampling: the ranges `aotc generate`,
    the Python API and the C++ runner accept too."""
    from aotc_runtime.sampling import Sampling

    value = _value(data, key, default)
    if value is None:
        return None
    why = Sampling(**{key: value}).check()
    if why is not None:
        raise RequestError(400, f"'{key}': {why}", param=key)
    return value if key in ("seed", "top_k") else float(value)


def _boolean(data: dict, key: str, default: bool) -> bool:
    value = _value(data, key, default)
    if not isinstance(value, bool):
        raise RequestError(400, f"'{key}' must be true or false; got {_shown(value)}", param=key)
    return value


def _text(data: dict, key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise RequestError(400, f"'{key}' must be a string; got {_shown(value)}", param=key)
    return value


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
