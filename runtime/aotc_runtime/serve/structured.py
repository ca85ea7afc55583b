"""A chat completion's `response_format` and `tools`: what form its answers must take, the grammar
that holds them to it (aotc_runtime.token_grammar, applied per row inside the sampler), and the tool
calls read back out of an answer, whole or as it streams. No server and no model here.

- `response_format`: {"type": "text"} (free), {"type": "json_object"} (a JSON object), or
  {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}} (JSON valid
  against the schema; held to it whether `strict` is true or not, as vLLM does).
- `tools`: up to 128 {"type": "function", "function": {"name", "description", "parameters",
  "strict"}}; `tool_choice`: "none" (the tools are not shown), "auto" (the default with tools: the
  model answers in text or calls tools), "required" (it calls at least one), or {"type":
  "function", "function": {"name"}} (it calls that one); `parallel_tool_calls` (default true: more
  than one call in an answer).

A tool call is written as Hermes and Qwen's templates write it, `<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>`, one per line, so models trained on that form read and write it
unchanged. A template that renders `tools` itself shows them; for one that ignores them, the tools
and that form are described in a system message (`tools_system_text`). With "auto" the grammar
allows free text that does not start a call, or calls whose JSON is held to the tools' schemas.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from aotc_runtime.serve.protocol import RequestError
from aotc_runtime.serve.request_fields import shown, shown_name

CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
MAX_TOOLS = 128  # OpenAI's limit
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function and schema names
NO_PARAMETERS = {"type": "object", "properties": {}}
TOOL_SHAPE = '{"type": "function", "function": {"name": ..., "parameters": {...}}}'
# Written beside the JSON schemas a grammar holds: how JSON is spelled (token_grammar.JSON_OPTIONS)
X_GUIDANCE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict

    def as_openai(self) -> dict:
        """The tool as OpenAI's request writes it (and transformers' templates read `tools`)."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}

    def call_schema(self) -> dict:
        """The JSON schema of one call of this tool: {"name": its name, "arguments": {...}}."""
        return {
            "type": "object",
            "properties": {"name": {"const": self.name}, "arguments": self.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }


@dataclass(frozen=True)
class Structure:
    """The form a request's answers take (see the module's text)."""

    schema: dict | None = None  # response_format's JSON schema; None: free text
    tools: tuple = ()  # Tool
    tool_choice: str = "none"  # "none", "auto", "required", or a tool's name
    parallel: bool = True

    @property
    def calls_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def constrained(self) -> bool:
        return self.calls_tools or self.schema is not None

    def grammar(self, vocabulary: Any) -> Any:
        """The token_grammar.TokenGrammar for `vocabulary` (the package's), or None when free; a
        schema or tool the grammar engine refuses is a 400 naming its field."""
        from aotc_runtime.token_grammar import GrammarError

        if not self.constrained:
            return None
        try:
            if not self.calls_tools:
                return vocabulary.json_schema(self.schema)
            return vocabulary.lark(self._lark())
        except GrammarError as exc:
            field = "tools" if self.calls_tools and self.schema is None else "response_format"
            raise RequestError(400, str(exc), param=field, code="invalid_schema") from None

    def _lark(self) -> str:
        """Calls of the chosen tools, each JSON held to its schema; with "auto", or else free
        text (the response format's JSON, given one) that does not start a call."""
        chosen = [t for t in self.tools if self.tool_choice in ("auto", "required", t.name)]
        calls = {"anyOf": [tool.call_schema() for tool in chosen], "x-guidance": X_GUIDANCE}
        many = ' ("\\n" call)*' if self.parallel else ""
        rules = [
            f"calls: call{many}",
            f"call: {json.dumps(CALL_OPEN)} %json {json.dumps(calls)} {json.dumps(CALL_CLOSE)}",
        ]
        if self.tool_choice != "auto":
            return "\n".join(["start: calls", *rules])
        if self.schema is not None:
            answer = {**self.schema, "x-guidance": X_GUIDANCE}
            return "\n".join(
                ["start: answer | calls", f"answer: %json {json.dumps(answer)}", *rules]
            )
        text = f"TEXT: /(?s:.+)/ & ~/{re.escape(CALL_OPEN.strip())}(?s:.*)/"
        return "\n".join(["start: TEXT | calls", *rules, text])


def read_structure(data: dict) -> Structure:
    """The request's `response_format`, `tools`, `tool_choice` and `parallel_tool_calls`."""
    tools = _tools(data.get("tools"))
    choice = _tool_choice(data.get("tool_choice"), tools)
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError(
            400, f"'parallel_tool_calls' must be true or false; got {shown(parallel)}",
            param="parallel_tool_calls",
        )  # fmt: skip
    return Structure(
        schema=_response_schema(data.get("response_format")),
        tools=tools,
        tool_choice=choice,
        parallel=parallel is not False,
    )


def _response_schema(given: Any) -> dict | None:
    kinds = (
        '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
        '{"name": ..., "schema": {...}}}'
    )
    if given is None:
        return None
    kind = given.get("type") if isinstance(given, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise RequestError(
            400, f"'response_format' is {shown(given)}; send {kinds}", param="response_format"
        )
    spec = given.get("json_schema")
    if not isinstance(spec, dict):
        raise RequestError(
            400, "'response_format' of type json_schema needs 'json_schema': {\"name\": ..., "
            "\"schema\": {...}}", param="response_format",
        )  # fmt: skip
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RequestError(
            400, f"'response_format.json_schema.name' is {shown(name)}; give a name of 1 to 64 "
            "letters, digits, '_' or '-'", param="response_format",
        )  # fmt: skip
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise RequestError(
            400, f"'response_format.json_schema.schema' is {shown(schema)}; give a JSON schema "
            "object", param="response_format",
        )  # fmt: skip
    return schema


def _tools(given: Any) -> tuple:
    if given is None or given == []:
        return ()
    if not isinstance(given, list):
        raise RequestError(400, f"'tools' must be a list of {TOOL_SHAPE}", param="tools")
    if len(given) > MAX_TOOLS:
        raise RequestError(
            400, f"'tools' lists {len(given)} tools; send at most {MAX_TOOLS}", param="tools"
        )
    tools = [_tool(number, tool) for number, tool in enumerate(given)]
    names = [tool.name for tool in tools]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise RequestError(
            400, f"'tools' names {twice!r} twice; give each tool its own name", param="tools"
        )
    return tuple(tools)


def _tool(number: int, tool: Any) -> Tool:
    function = tool.get("function") if isinstance(tool, dict) else None
    if (
        not isinstance(tool, dict)
        or tool.get("type") != "function"
        or not isinstance(function, dict)
    ):
        raise RequestError(
            400, f"tool {number} is {shown(tool)}; each tool is {TOOL_SHAPE}", param="tools"
        )
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RequestError(
            400, f"tool {number}'s name is {shown(name)}; give 1 to 64 letters, digits, '_' or '-'",
            param="tools",
        )  # fmt: skip
    description = function.get("description") or ""
    parameters = function.get("parameters")
    if parameters is None:
        parameters = NO_PARAMETERS
    if not isinstance(description, str) or not isinstance(parameters, dict):
        raise RequestError(
            400, f"tool {name!r}: 'description' must be text and 'parameters' a JSON schema "
            "object", param="tools",
        )  # fmt: skip
    return Tool(name, description, parameters)


def _tool_choice(given: Any, tools: tuple) -> str:
    if given is None:
        return "auto" if tools else "none"
    if given in ("none", "auto", "required"):
        name = given
    elif (
        isinstance(given, dict)
        and given.get("type") == "function"
        and isinstance(given.get("function"), dict)
        and isinstance(given["function"].get("name"), str)
    ):
        name = given["function"]["name"]
        if name not in {tool.name for tool in tools}:
            raise RequestError(
                400, f"'tool_choice' names {shown_name(name)}, which 'tools' does not list; name "
                "one of its tools", param="tool_choice",
            )  # fmt: skip
    else:
        raise RequestError(
            400, f"'tool_choice' is {shown(given)}; send \"none\", \"auto\", \"required\" or "
            '{"type": "function", "function": {"name": ...}}', param="tool_choice",
        )  # fmt: skip
    if name in ("auto", "required") and not tools:
        raise RequestError(
            400, f"'tool_choice' is {name!r} but 'tools' lists none; send tools, or leave "
            "'tool_choice' out", param="tool_choice",
        )  # fmt: skip
    return name


def tools_system_text(tools: tuple) -> str:
    """The tools and how to call them, for a template that does not render `tools` (the words of
    Hermes' and Qwen's tool prompts)."""
    listed = "\n".join(json.dumps(tool.as_openai()) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{listed}\n</tools>\n\nFor each function call, return a json object with function name "
        "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def tool_call_text(calls: list) -> str:
    """An assistant message's `tool_calls` (OpenAI's shape) written as the model writes them."""
    written = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(
                400, "an assistant message's 'tool_calls' hold {\"id\": ..., \"type\": "
                "\"function\", \"function\": {\"name\": ..., \"arguments\": \"{...}\"}}",
                param="messages",
            )  # fmt: skip
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = arguments  # shown to the model as the client sent it
        body = json.dumps({"name": function["name"], "arguments": parsed})
        written.append(f"{CALL_OPEN}{body}{CALL_CLOSE}")
    return "\n".join(written)


def new_call(name: str, arguments: Any, index: int) -> dict:
    return {
        "index": index,
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def read_calls(text: str) -> list | None:
    """The complete tool calls an answer's text holds (OpenAI's shape, with their `index`): all of
    them for an answer that ended, those before the cut for one cut at its last token; None when
    the text is not calls (free text)."""
    stream = CallStream()
    _content, calls = stream.add(text)
    return calls if stream.calling else None


class CallStream:
    """One streamed answer's text, split into content and tool calls as it comes: text that may
    still be the start of a call is held back until it is not; each call is sent whole once its
    closing tag arrives (OpenAI's clients accumulate a call's arguments from any number of
    chunks)."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0  # characters of content sent, or of calls read
        self.calling = False
        self.calls = 0

    def add(self, delta: str) -> tuple[str, list]:
        """(the content to send now, the calls completed) after `delta`."""
        self.text += delta
        if not self.calling:
            if CALL_OPEN.startswith(self.text) and self.sent == 0:
                return "", []  # still maybe a call
            if self.sent == 0 and self.text.startswith(CALL_OPEN):
                self.calling = True
            else:
                content, self.sent = self.text[self.sent :], len(self.text)
                return content, []
        done: list[dict] = []
        while True:
            end = self.text.find(CALL_CLOSE, self.sent)
            if end < 0:
                return "", done
            body = (
                self.text[self.sent : end].strip("\n").removeprefix(CALL_OPEN.strip()).strip("\n")
            )
            self.sent = end + len(CALL_CLOSE)
            try:
                call = json.loads(body)
            except ValueError:
                continue  # the grammar makes this unreachable
            done.append(new_call(call["name"], call.get("arguments", {}), self.calls))
            self.calls += 1

    def rest(self) -> str:
        """At the answer's end: content held back (the start of a call that never came)."""
        if self.calling:
            return ""
        content, self.sent = self.text[self.sent :], len(self.text)
        return content
