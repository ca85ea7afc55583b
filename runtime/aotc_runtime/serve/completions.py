"""The OpenAI completions protocol of `aotc serve` for text-generation packages: a request body ->
what to generate, checked against the package; the engine's tokens -> OpenAI's answer or its
server-sent chunks. No server and no model here, so every check is tested without one.

`POST /v1/completions` (served by runtime/aotc_runtime/serve/completion_server.py with
completion_engine.py):
- `prompt`: text (with the package's tokenizer), a list of token ids, or a list of either (one
  answer per prompt, as LangChain sends a batch); `max_tokens` (16); `echo` (the answer's text
  starts with the prompt's); `logprobs` (0 to 20: each new token's logprob and that many
  alternatives, in OpenAI's legacy shape); `suffix` only null.
- The fields chat shares (runtime/aotc_runtime/serve/request_fields.py): `temperature` (0 is
  greedy; left out, the model's default), `top_p`, `top_k`, `min_p`, `presence_penalty`,
  `frequency_penalty`, `repetition_penalty`, `seed`, `n`, `stop` (a string or up to 4),
  `ignore_eos`, `stream`, `stream_options` (`include_usage`), `model`, `user`. Any other field is
  refused, naming it; `best_of` and `logit_bias` only at their neutral values.
- The answer: {"id", "object": "text_completion", "created", "model", "choices": [{"index",
  "text", "token_ids", "logprobs", "finish_reason": "length" | "stop"}], "usage"}; choice i * n + j
  is prompt i's answer j. `token_ids` is aotc's addition (the new tokens, with the
  end-of-sequence token when one ended the text, as `aotc generate` lists them). Streamed:
  `data: {chunk}` events, each with one choice's new text and ids, the last of a choice with its
  finish_reason; with `include_usage` a last chunk with no choices and the usage; then
  `data: [DONE]`.

Every refusal is a protocol.RequestError (400, or 413 for a body above the limit) with one line
that says what to send instead, and the field at fault as its `param`; the package's own limits
(the vocabulary, the cache) use the runtime's words (GenerationRequest.check).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.sampling_settings import MAX_LOGPROBS
from aotc_runtime.serve import request_fields as fields
from aotc_runtime.serve.logprobs import completion_logprobs
from aotc_runtime.serve.protocol import RequestError
from aotc_runtime.serve.request_fields import Choice, Decoding

MAX_TOKENS_DEFAULT = 16  # OpenAI's
FIELDS = ("prompt", "max_tokens", "echo", "logprobs", *fields.SHARED_FIELDS)
# OpenAI's fields this server leaves out, and the values each may still carry (or null)
NEUTRAL = {"best_of": (1,), "suffix": ("",), "logit_bias": ({},)}
# bytes of a request beyond its prompt: every other field at its longest, with room to spare
BODY_ALLOWANCE = 16 << 10
MAX_TOKEN_ID = 2**63 - 1  # ids travel as int64: a larger one is no token of any vocabulary


@dataclass(frozen=True, kw_only=True)
class CompletionRequest:
    decoding: Decoding  # how its answers are decoded and sent
    prompts: tuple = ()  # each a list of token ids
    prompt_texts: tuple = ()  # each prompt as text (echo), or None without a tokenizer
    echo: bool = False
    choices: tuple = ()  # request_fields.Choice, in OpenAI's order

    @property
    def prompt_ids(self) -> list:
        """The first prompt's ids (the only one, unless a list of prompts was sent)."""
        return list(self.prompts[0])


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


def check_body_size(body: bytes, generation: Any) -> None:
    limit = max_body_bytes(generation.max_seq_len)
    if len(body) > limit:
        raise body_too_large_for_prompt(len(body), limit, generation.max_seq_len)


def parse_completion(body: bytes, generation: Any, tokenizer: Any = None) -> CompletionRequest:
    """The request in `body`, checked against the package's `generation` (aotc_runtime's
    Generation); `tokenizer` (a tokenizers.Tokenizer) when the package carries one."""
    check_body_size(body, generation)
    data = fields.json_object(body, '{"prompt": ...}')
    fields.check_fields(data, FIELDS, NEUTRAL, "a completion")
    if data.get("prompt") is None:
        raise RequestError(
            400, "'prompt' is missing; send text or a list of token ids", param="prompt"
        )
    prompts, texts = _prompts(data["prompt"], generation, tokenizer)
    max_tokens = fields.integer(data, "max_tokens", MAX_TOKENS_DEFAULT, low=1)
    logprobs = fields.integer(data, "logprobs", None, low=0, high=MAX_LOGPROBS)
    decoding = fields.read_decoding(data, tokenizer, max_tokens, generation, logprobs)
    echo = fields.boolean(data, "echo", False)
    if echo and tokenizer is None:
        raise RequestError(
            400, "'echo' returns the prompt as text, but this package carries no tokenizer; "
            "leave 'echo' out", param="echo",
        )  # fmt: skip
    if echo and logprobs is not None:
        raise RequestError(
            400, "'echo' with 'logprobs' asks for the prompt's logprobs, which this server does "
            "not compute (the package's program gives logits for new tokens only); send one of "
            "them", param="echo",
        )  # fmt: skip
    choices = fields.make_choices(
        prompts, decoding, [max_tokens] * len(prompts), generation, "prompt"
    )
    return CompletionRequest(
        decoding=decoding, prompts=tuple(map(tuple, prompts)),
        prompt_texts=tuple(texts), echo=echo, choices=choices,
    )  # fmt: skip


def _prompts(prompt: Any, generation: Any, tokenizer: Any) -> tuple[list, list]:
    """(each prompt's ids, each prompt's text) of `prompt`: text, ids, or a list of either."""
    one = isinstance(prompt, str) or (
        isinstance(prompt, list) and all(_is_id(i) for i in prompt) and prompt
    )
    listed = [prompt] if one else prompt
    if not isinstance(listed, list) or not listed:
        raise RequestError(
            400,
            "the prompt is empty; give at least one token"
            if listed == []
            else "'prompt' must be text, a list of token ids, or a list of either; got "
            f"{type(prompt).__name__}",
            param="prompt",
        )
    if len(listed) > fields.MAX_CHOICES:
        raise RequestError(
            400, f"'prompt' lists {len(listed)} prompts; send at most {fields.MAX_CHOICES} in "
            "one request", param="prompt",
        )  # fmt: skip
    ids = [_prompt_ids(each, generation, tokenizer) for each in listed]
    texts = [
        given if isinstance(given, str) else tokenizer.decode(each) if tokenizer else None
        for given, each in zip(listed, ids)
    ]
    return ids, texts


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompt_ids(prompt: Any, generation: Any, tokenizer: Any) -> list:
    if isinstance(prompt, str):
        ids = _encode(prompt, tokenizer)
    elif isinstance(prompt, list) and all(_is_id(i) for i in prompt):
        ids = list(prompt)
        # before any tensor is made of them: torch cannot hold an id beyond int64
        bad = next((i for i in ids if not 0 <= i <= MAX_TOKEN_ID), None)
        if bad is not None:
            raise RequestError(
                400,
                f"token id {fields.shown(bad)} is outside the vocabulary "
                f"(0..{generation.vocab_size - 1})",
                param="prompt",
            )
    else:
        raise RequestError(
            400,
            "'prompt' must be text, a list of token ids, or a list of either; got a list "
            f"holding {type(prompt).__name__}",
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
    fields.check_unicode(prompt, "prompt")
    return tokenizer.encode(prompt).ids


class CompletionShape:
    """How the completions endpoint writes what the engine made (answers.py collects it)."""

    object, chunk_object, id_prefix = "text_completion", "text_completion", "cmpl-"

    def __init__(self, request: CompletionRequest, tokenizer: Any):
        self.request, self.tokenizer = request, tokenizer
        self._offsets: dict = {}  # choice index -> text offset of its next token (logprobs)

    def _echo(self, choice: Choice) -> str:
        if not self.request.echo:
            return ""
        return self.request.prompt_texts[choice.prompt_index] or ""

    def whole_choice(
        self, choice: Choice, text: str, ids: list, tokens: list, finish: FinishReason
    ) -> dict:
        """One choice of the whole answer: `tokens` its logprob entries (engine events)."""
        return {
            "index": choice.index,
            "text": self._echo(choice) + text,
            "token_ids": list(ids),
            "logprobs": self._logprobs(choice, tokens),
            "finish_reason": finish,
        }

    def chunk_choices(self, choice: Choice, event: dict, first: bool) -> list:
        """The streamed choices for one engine event of `choice` (`first`: its first event)."""
        echo = self._echo(choice) if first else ""
        return [
            {
                "index": choice.index,
                "text": echo + event["text"],
                "token_ids": list(event["token_ids"]),
                "logprobs": self._logprobs(choice, [event]),
                "finish_reason": event["finish_reason"],
            }
        ]

    def _logprobs(self, choice: Choice, events: list) -> dict | None:
        if self.request.decoding.logprobs is None:
            return None
        offset = self._offsets.get(choice.index, 0)
        shaped, self._offsets[choice.index] = completion_logprobs(events, self.tokenizer, offset)
        return shaped


DONE_EVENT = b"data: [DONE]\n\n"


def sse_event(data: dict) -> bytes:
    """One server-sent event carrying `data` as JSON (one line: JSON escapes newlines)."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
