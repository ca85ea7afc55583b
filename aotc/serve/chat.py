"""OpenAI's chat completions for a text-generation package that carries a chat template: a request
body -> the prompt the template makes of its messages, checked against the package; the engine's
tokens -> a `chat.completion` or its `chat.completion.chunk` events. No server and no model here.

`POST /v1/chat/completions` (served by aotc/serve/completion_server.py):
- `messages`: a list of {"role", "content"} (content as text, or a list of {"type": "text",
  "text"} parts, joined; `name` passed on), rendered by the package's template
  (aotc_runtime.chat_template, in a sandbox) with the generation prompt, as transformers'
  `apply_chat_template` renders and tokenizes it.
- `max_completion_tokens` (or its older name `max_tokens`): default, what the KV cache holds after
  the prompt (OpenAI's default is the model's context too).
- `logprobs` (true: each new token's logprob) and `top_logprobs` (0 to 20 alternatives).
- The fields completions share (aotc/serve/request_fields.py): `temperature`, `top_p`, `top_k`,
  `min_p`, the penalties, `seed`, `n`, `stop`, `ignore_eos`, `stream`, `stream_options`, `model`,
  `user`. Tools, response formats and logit biases are accepted only at their neutral values.
- The answer: {"id": "chatcmpl-...", "object": "chat.completion", "created", "model", "choices":
  [{"index", "message": {"role": "assistant", "content"}, "logprobs", "finish_reason"}],
  "usage"}. Streamed: `chat.completion.chunk` events whose choices carry a `delta` (the first of
  each choice with its role), the last of a choice with its finish_reason; with `include_usage`
  a last chunk with no choices and the usage; then `data: [DONE]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aotc.serve import request_fields as fields
from aotc.serve.completions import check_body_size
from aotc.serve.logprobs import chat_logprobs
from aotc.serve.protocol import RequestError
from aotc.serve.request_fields import Choice, Decoding, shown_name

FIELDS = ("messages", "model", "max_completion_tokens", "max_tokens", "logprobs", "top_logprobs",
          "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "seed", "n", "stop", "ignore_eos", "stream", "stream_options",
          "user")  # fmt: skip
# OpenAI's fields this server leaves out, and the values each may still carry (or null)
NEUTRAL = {
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (True, False),  # says nothing without tools
    "functions": ([],),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
}
MESSAGE_KEYS = ("role", "content", "name")
NO_TEMPLATE = (
    "this package carries no chat template, so it cannot turn messages into a prompt; send a "
    "prompt to /v1/completions, or export the model from its folder with its chat template "
    "(aotc export MODEL_DIR --task text-generation)"
)


@dataclass(frozen=True, kw_only=True)
class ChatRequest(Decoding):
    prompt_ids: tuple = ()
    choices: tuple = ()  # request_fields.Choice, in OpenAI's order


def parse_chat(body: bytes, generation: Any, tokenizer: Any, template: Any) -> ChatRequest:
    """The request in `body`, checked against the package: `template` is its
    aotc_runtime.chat_template.ChatTemplate (None: it carries none), `tokenizer` its
    tokenizers.Tokenizer."""
    check_body_size(body, generation)
    data = fields.json_object(body, '{"messages": [{"role": "user", "content": "..."}]}')
    fields.check_fields(data, FIELDS, NEUTRAL, "a chat completion")
    if template is None or tokenizer is None:
        raise RequestError(400, NO_TEMPLATE, code="chat_template_missing")
    prompt = _prompt_ids(data.get("messages"), template, tokenizer)
    room = generation.max_seq_len - len(prompt)
    asked = fields.integer(data, "max_completion_tokens", None, low=1)
    if asked is None:
        asked = fields.integer(data, "max_tokens", None, low=1)
    max_tokens = asked if asked is not None else max(room, 1)
    decoding = fields.read_decoding(data, tokenizer, max_tokens)
    wants = fields.boolean(data, "logprobs", False)
    top = fields.integer(data, "top_logprobs", None, low=0, high=fields.MAX_LOGPROBS)
    if top is not None and not wants:
        raise RequestError(
            400, "'top_logprobs' needs \"logprobs\": true; send both, or leave it out",
            param="top_logprobs",
        )  # fmt: skip
    known = fields.decoding_fields(decoding)
    known["logprobs"] = (top or 0) if wants else None
    decoding = Decoding(**known)
    choices = fields.make_choices([prompt], decoding, [max_tokens], generation, "messages")
    return ChatRequest(**known, prompt_ids=tuple(prompt), choices=choices)


def _prompt_ids(messages: Any, template: Any, tokenizer: Any) -> list:
    """The template's prompt for the messages; the template's refusal as a 400 on `messages`, a
    template stopped by its bounds (the package's fault, not the request's) as a 500."""
    from aotc_runtime.errors import GenerationInputError, PackageError

    if not isinstance(messages, list) or not messages:
        raise RequestError(
            400, "'messages' must be a non-empty list of {\"role\": ..., \"content\": \"text\"} "
            "objects", param="messages",
        )  # fmt: skip
    plain = [_message(number, message) for number, message in enumerate(messages)]
    try:
        return template.prompt_ids(tokenizer, plain, add_generation_prompt=True)
    except GenerationInputError as exc:
        raise RequestError(400, str(exc), param="messages") from None
    except PackageError as exc:
        raise RequestError(500, str(exc), code="chat_template_stopped") from None


def _message(number: int, message: Any) -> dict:
    """One message as the template reads it: role, content as text, and name if given."""
    shape = 'send {"role": ..., "content": "text"}'
    if not isinstance(message, dict):
        raise RequestError(
            400, f"message {number} is a {type(message).__name__}; {shape}", param="messages"
        )
    extra = [key for key in message if key not in MESSAGE_KEYS]
    if extra:
        raise RequestError(
            400, f"message {number} has {shown_name(extra[0])}, which this server does not take "
            f"(tools and function calls are not served); a message takes "
            f"{', '.join(MESSAGE_KEYS)}", param="messages",
        )  # fmt: skip
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(_text_part(number, part) for part in content)
    plain = {"role": message.get("role"), "content": content}
    if message.get("name") is not None:
        plain["name"] = message["name"]
    for key in ("role", "content", "name"):
        if key in plain and not isinstance(plain[key], str):
            raise RequestError(
                400, f"message {number}'s '{key}' is {fields.shown(plain[key])}; {shape}",
                param="messages",
            )  # fmt: skip
        if key in plain:
            fields.check_unicode(plain[key], "messages")
    return plain


def _text_part(number: int, part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part["text"]
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    raise RequestError(
        400, f"message {number} holds a content part of type {fields.shown(kind)}; this server "
        'takes text only ({"type": "text", "text": ...})', param="messages",
    )  # fmt: skip


class ChatShape:
    """How the chat endpoint writes what the engine made (answers.py collects it)."""

    object, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def __init__(self, request: ChatRequest, tokenizer: Any):
        self.request, self.tokenizer = request, tokenizer

    def whole_choice(self, choice: Choice, text: str, ids: list, tokens: list, finish: str) -> dict:
        return {
            "index": choice.index,
            "message": {"role": "assistant", "content": text},
            "logprobs": self._logprobs(tokens),
            "finish_reason": finish,
        }

    def chunk_choices(self, choice: Choice, event: dict, first: bool) -> list:
        delta = (
            {"role": "assistant", "content": event["text"]} if first else {"content": event["text"]}
        )
        return [
            {
                "index": choice.index,
                "delta": delta,
                "logprobs": self._logprobs([event]),
                "finish_reason": event["finish_reason"],
            }
        ]

    def _logprobs(self, events: list) -> dict | None:
        if self.request.logprobs is None:
            return None
        return chat_logprobs(events, self.tokenizer)
