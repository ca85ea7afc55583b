"""OpenAI's chat completions for a text-generation package that carries a chat template: a request
body -> the prompt the template makes of its messages, checked against the package; the engine's
tokens -> a `chat.completion` or its `chat.completion.chunk` events. No server and no model here.

`POST /v1/chat/completions` (served by runtime/aotc_runtime/serve/completion_server.py):
- `messages`: a list of {"role", "content"} (content as text, or a list of {"type": "text",
  "text"} parts, joined; `name` passed on), rendered by the package's template
  (aotc_runtime.chat_template, in a sandbox) with the generation prompt, as transformers'
  `apply_chat_template` renders and tokenizes it.
- `max_completion_tokens` (or its older name `max_tokens`): default, what the KV cache holds after
  the prompt (OpenAI's default is the model's context too).
- `logprobs` (true: each new token's logprob) and `top_logprobs` (0 to 20 alternatives).
- The fields completions share (runtime/aotc_runtime/serve/request_fields.py): `temperature`,
  `top_p`, `top_k`, `min_p`, the penalties, `seed`, `n`, `stop`, `ignore_eos`, `stream`,
  `stream_options`, `model`, `user`. Logit biases and the older `functions` are accepted only at
  their neutral values.
- `response_format`, `tools`, `tool_choice`, `parallel_tool_calls`
  (runtime/aotc_runtime/serve/structured.py): the answers held to a JSON schema, or to calls of
  the tools. Messages may carry an assistant's `tool_calls` and a tool's answer (role "tool",
  `tool_call_id`).
- The answer: {"id": "chatcmpl-...", "object": "chat.completion", "created", "model", "choices":
  [{"index", "message": {"role": "assistant", "content", "tool_calls" when it called tools},
  "logprobs", "finish_reason": "stop" | "length" | "tool_calls"}], "usage"}. Streamed:
  `chat.completion.chunk` events whose choices carry a `delta` (the first of each choice with its
  role; a tool call whole in one delta), the last of a choice with its finish_reason; with
  `include_usage` a last chunk with no choices and the usage; then `data: [DONE]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.sampling_settings import MAX_LOGPROBS
from aotc_runtime.serve import request_fields as fields
from aotc_runtime.serve.completions import check_body_size
from aotc_runtime.serve.logprobs import chat_logprobs
from aotc_runtime.serve.protocol import RequestError
from aotc_runtime.serve.request_fields import Choice, Decoding, shown_name
from aotc_runtime.serve.structured import (
    CallStream,
    Structure,
    read_calls,
    read_structure,
    tool_call_text,
    tools_system_text,
)

FIELDS = ("messages", "max_completion_tokens", "max_tokens", "logprobs", "top_logprobs",
          *fields.SHARED_FIELDS, "response_format", "tools", "tool_choice",
          "parallel_tool_calls")  # fmt: skip
# OpenAI's fields this server leaves out, and the values each may still carry (or null)
NEUTRAL = {
    "logit_bias": ({},),
    "functions": ([],),
    "function_call": ("none",),
}
MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")
NO_TEMPLATE = (
    "this package carries no chat template, so it cannot turn messages into a prompt; send a "
    "prompt to /v1/completions, or export the model from its folder with its chat template "
    "(aotc export MODEL_DIR --task text-generation)"
)


@dataclass(frozen=True, kw_only=True)
class ChatRequest:
    decoding: Decoding  # how its answers are decoded and sent
    prompt_ids: tuple = ()
    choices: tuple = ()  # request_fields.Choice, in OpenAI's order
    structure: Structure = Structure()


def parse_chat(
    body: bytes, generation: Any, tokenizer: Any, template: Any, vocabulary: Any = None
) -> ChatRequest:
    """The request in `body`, checked against the package: `template` is its
    aotc_runtime.chat_template.ChatTemplate (None: it carries none), `tokenizer` its
    tokenizers.Tokenizer, `vocabulary` a callable giving its token_grammar.Vocabulary (made when a
    request first asks for a JSON schema or tools)."""
    check_body_size(body, generation)
    data = fields.json_object(body, '{"messages": [{"role": "user", "content": "..."}]}')
    fields.check_fields(data, FIELDS, NEUTRAL, "a chat completion")
    if template is None or tokenizer is None:
        raise RequestError(400, NO_TEMPLATE, code="chat_template_missing")
    structure = read_structure(data)
    prompt = _prompt_ids(data.get("messages"), template, tokenizer, structure)
    room = generation.max_seq_len - len(prompt)
    asked = fields.integer(data, "max_completion_tokens", None, low=1)
    if asked is None:
        asked = fields.integer(data, "max_tokens", None, low=1)
    max_tokens = asked if asked is not None else max(room, 1)
    wants = fields.boolean(data, "logprobs", False)
    top = fields.integer(data, "top_logprobs", None, low=0, high=MAX_LOGPROBS)
    if top is not None and not wants:
        raise RequestError(
            400, "'top_logprobs' needs \"logprobs\": true; send both, or leave it out",
            param="top_logprobs",
        )  # fmt: skip
    logprobs = (top or 0) if wants else None
    decoding = fields.read_decoding(data, tokenizer, max_tokens, generation, logprobs)
    grammar = structure.grammar(_vocabulary(vocabulary)) if structure.constrained else None
    choices = fields.make_choices(
        [prompt], decoding, [max_tokens], generation, "messages", grammar=grammar
    )
    return ChatRequest(
        decoding=decoding, prompt_ids=tuple(prompt), choices=choices, structure=structure
    )


def _vocabulary(vocabulary: Any) -> Any:
    from aotc_runtime.errors import MissingDependencyError

    if vocabulary is None:
        raise RequestError(400, "this server takes no response_format or tools", code="unsupported")
    try:
        return vocabulary()
    except MissingDependencyError as exc:
        raise RequestError(501, str(exc), code="structured_output_unavailable") from None


def _prompt_ids(messages: Any, template: Any, tokenizer: Any, structure: Structure) -> list:
    """The template's prompt for the messages (and the tools, when the request may call them);
    the template's refusal as a 400 on `messages`, a template stopped by its bounds (the
    package's fault, not the request's) as a 500."""
    from aotc_runtime.errors import GenerationInputError, PackageError

    if not isinstance(messages, list) or not messages:
        raise RequestError(
            400, "'messages' must be a non-empty list of {\"role\": ..., \"content\": \"text\"} "
            "objects", param="messages",
        )  # fmt: skip
    plain = [_message(number, message) for number, message in enumerate(messages)]
    try:
        if not structure.calls_tools:
            return template.prompt_ids(tokenizer, plain, add_generation_prompt=True)
        tools = [tool.as_openai() for tool in structure.tools]
        shown_tools = template.render(plain, True, tools)
        if shown_tools != template.render(plain, True):  # the template renders them itself
            return list(tokenizer.encode(shown_tools, add_special_tokens=False).ids)
        return template.prompt_ids(tokenizer, _with_tools_text(plain, structure.tools))
    except GenerationInputError as exc:
        raise RequestError(400, str(exc), param="messages") from None
    except PackageError as exc:
        raise RequestError(500, str(exc), code="chat_template_stopped") from None


def _with_tools_text(messages: list, tools: tuple) -> list:
    """The messages with the tools described in the system message (the first message's, if it is
    one; else a new first message), for a template that does not render `tools`."""
    text = tools_system_text(tools)
    if messages[0]["role"] == "system":
        first = {**messages[0], "content": messages[0]["content"] + "\n\n" + text}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _message(number: int, message: Any) -> dict:
    """One message as the template reads it: role, content as text, and name if given; an
    assistant's tool calls written into its content as the model writes them, a tool's answer
    with its role "tool"."""
    shape = 'send {"role": ..., "content": "text"}'
    if not isinstance(message, dict):
        raise RequestError(
            400, f"message {number} is a {type(message).__name__}; {shape}", param="messages"
        )
    extra = [key for key in message if key not in MESSAGE_KEYS]
    if extra:
        raise RequestError(
            400, f"message {number} has {shown_name(extra[0])}, which this server does not take; "
            f"a message takes {', '.join(MESSAGE_KEYS)}", param="messages",
        )  # fmt: skip
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(_text_part(number, part) for part in content)
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise RequestError(
                400, f"message {number}'s 'tool_calls' is {fields.shown(calls)}; send a list",
                param="messages",
            )  # fmt: skip
        content = "\n".join(part for part in (content or "", tool_call_text(calls)) if part)
    plain = {"role": message.get("role"), "content": content}
    if message.get("name") is not None:
        plain["name"] = message["name"]
    for key in ("role", "content", "name"):
        if key not in plain:
            continue
        value = plain[key]
        if not isinstance(value, str):
            raise RequestError(
                400, f"message {number}'s '{key}' is {fields.shown(value)}; {shape}",
                param="messages",
            )  # fmt: skip
        fields.check_unicode(value, "messages")
    return plain


def _text_part(number: int, part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part["text"]
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    raise RequestError(
        400, f"message {number} holds a content part of type {fields.shown(kind)}; this server "
        'takes text only ({"type": "text", "text": ...})', param="messages",
    )  # fmt: skip


# OpenAI's chat finish_reason of an answer that ended (FinishReason.STOP) holding tool calls
TOOL_CALLS = "tool_calls"


def chat_finish_reason(finish: FinishReason | None, called: bool) -> FinishReason | str | None:
    """The chat answer's finish_reason: the engine's, but "tool_calls" for an answer that stopped
    holding tool calls (one cut at its last token stays "length", its complete calls given). The
    engine knows no tools (finish_reason.py): this is the one place that says it."""
    return TOOL_CALLS if called and finish is FinishReason.STOP else finish


class ChatShape:
    """How the chat endpoint writes what the engine made (answers.py collects it). An answer of a
    request that may call tools is read for its calls (structured.py): a whole answer's calls go
    in `tool_calls`, a streamed answer's each in one delta once it is complete (with its `index`,
    as OpenAI streams them), and either ends with finish_reason "tool_calls"
    (chat_finish_reason)."""

    object, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def __init__(self, request: ChatRequest, tokenizer: Any):
        self.request, self.tokenizer = request, tokenizer
        self._streams: dict = {}  # choice index -> its CallStream, with tools

    def whole_choice(
        self, choice: Choice, text: str, ids: list, tokens: list, finish: FinishReason
    ) -> dict:
        message: dict = {"role": "assistant", "content": text}
        calls = read_calls(text) if self.request.structure.calls_tools else None
        if calls:  # those complete, when the answer was cut at its last token
            whole = [{k: v for k, v in call.items() if k != "index"} for call in calls]
            message = {"role": "assistant", "content": None, "tool_calls": whole}
        return {
            "index": choice.index,
            "message": message,
            "logprobs": self._logprobs(tokens),
            "finish_reason": chat_finish_reason(finish, bool(calls)),
        }

    def chunk_choices(self, choice: Choice, event: dict, first: bool) -> list:
        content, calls, finish = event["text"], [], event["finish_reason"]
        if self.request.structure.calls_tools:
            stream = self._streams.setdefault(choice.index, CallStream())
            content, calls = stream.add(event["text"])
            if finish is not None:
                content += stream.rest()
                finish = chat_finish_reason(finish, bool(stream.calls))
        delta: dict = {"role": "assistant"} if first else {}
        if calls:
            delta["tool_calls"] = calls
        if content or not calls:
            delta["content"] = content
        return [
            {
                "index": choice.index,
                "delta": delta,
                "logprobs": self._logprobs([event]),
                "finish_reason": finish,
            }
        ]

    def _logprobs(self, events: list) -> dict | None:
        if self.request.decoding.logprobs is None:
            return None
        return chat_logprobs(events, self.tokenizer)
