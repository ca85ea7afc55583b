"""The tool-call form of runtime/aotc_runtime/serve/structured.py on texts, no model: a streamed
answer split at any point gives the calls and content of the whole, text that only looks like a
call's start flows on, the grammar a request asks for is the one its tools and format name, and an
answer with calls ends with finish_reason "tool_calls" (runtime/aotc_runtime/serve/chat.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.serve.chat import ChatShape
from aotc_runtime.serve.structured import CallStream, Structure, Tool, read_calls, read_structure

CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": 1}}\n</tool_call>'
)


def streamed(text: str, size: int) -> tuple[str, list]:
    stream, content, calls = CallStream(), "", []
    for start in range(0, len(text), size):
        more, done = stream.add(text[start : start + size])
        content, calls = content + more, calls + done
    return content + stream.rest(), calls


def shape(calls: list) -> list:
    return [
        (c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
    ]


@pytest.mark.parametrize("size", [1, 2, 5, 13, 1000])
def test_calls_streamed_in_any_pieces_are_the_whole_answers(size):
    content, calls = streamed(CALLS, size)
    assert content == ""
    assert (
        shape(calls)
        == shape(read_calls(CALLS))
        == [
            (0, "get_weather", {"city": "Oslo"}),
            (1, "get_time", {"zone": 1}),
        ]
    )
    assert all(call["id"].startswith("call_") for call in calls)


@pytest.mark.parametrize("text", ["<b>bold</b> text", "<tool", "Hello <tool_call>"])
def test_text_that_only_looks_like_a_call_flows_whole(text):
    for size in (1, 3, 100):
        assert streamed(text, size) == (text, [])
    assert read_calls(text) is None


def test_a_cut_answer_keeps_its_complete_calls():
    cut = CALLS[: CALLS.rindex("{")]
    assert shape(read_calls(cut)) == [(0, "get_weather", {"city": "Oslo"})]
    assert shape(streamed(cut, 4)[1]) == shape(read_calls(cut))


def test_tool_choice_picks_the_calls_the_grammar_allows():
    tools = (Tool("a", "", {"type": "object"}), Tool("b", "", {"type": "object"}))
    named = Structure(tools=tools, tool_choice="b", parallel=False)._lark()
    assert (
        named.startswith("start: calls") and '"const": "b"' in named and '"const": "a"' not in named
    )
    assert "call (" not in named  # one call
    auto = Structure(tools=tools, tool_choice="auto")._lark()
    assert auto.startswith("start: TEXT | calls") and '("\\n" call)*' in auto
    with_format = Structure(schema={"type": "object"}, tools=tools, tool_choice="auto")._lark()
    assert with_format.startswith("start: answer | calls")


def test_read_structure_defaults_as_openai_does():
    assert read_structure({}) == Structure()
    tools = [{"type": "function", "function": {"name": "f"}}]
    chosen = read_structure({"tools": tools})
    assert (
        chosen.tool_choice == "auto"
        and chosen.parallel
        and chosen.tools[0].parameters == {"type": "object", "properties": {}}
    )
    assert read_structure({"response_format": {"type": "json_object"}}).schema == {"type": "object"}
    assert read_structure({"response_format": {"type": "text"}}).schema is None


@pytest.mark.parametrize(
    "text, finish, said",
    [
        (CALLS, FinishReason.STOP, "tool_calls"),  # an answer that stopped holding calls
        (CALLS[: CALLS.rindex("{")], FinishReason.LENGTH, "length"),  # cut: its complete calls
        ("It is sunny.", FinishReason.STOP, "stop"),  # no call: the engine's reason
        ("It is", FinishReason.LENGTH, "length"),
    ],
    ids=["calls", "cut-calls", "text", "cut-text"],
)
def test_a_chat_answer_says_tool_calls_for_a_stop_with_calls_whole_and_streamed(text, finish, said):
    """chat_finish_reason, the one place "tool_calls" is said: a whole answer and its stream (in
    pieces of 7 characters) end with the same finish_reason, written as OpenAI's plain string."""
    request = SimpleNamespace(
        structure=SimpleNamespace(calls_tools=True), decoding=SimpleNamespace(logprobs=None)
    )
    choice = SimpleNamespace(index=0)
    whole = ChatShape(request, None).whole_choice(choice, text, [], [], finish)
    shape, chunks = ChatShape(request, None), []
    for start in range(0, len(text), 7):
        last = start + 7 >= len(text)
        event = {"text": text[start : start + 7], "finish_reason": finish if last else None}
        chunks += shape.chunk_choices(choice, event, first=start == 0)
    assert [chunk["finish_reason"] for chunk in chunks] == [None] * (len(chunks) - 1) + [said]
    assert whole["finish_reason"] == said
    for written in (json.dumps(whole), json.dumps(chunks[-1])):
        assert f'"finish_reason": "{said}"' in written
    assert (whole["message"]["content"] is None) == text.startswith("<tool_call>")
