"""Structured output through `aotc serve`'s /v1/chat/completions: `response_format` (json_object,
json_schema) and `tools` with each `tool_choice`, through the official `openai` client (`create`,
`parse` with a pydantic model, streamed tool calls) and LangChain (`bind_tools`,
`with_structured_output`), in-process through an ASGI test client (no Ray). The model is GPT-2 from
the zoo with random weights and a byte-level BPE tokenizer (tests/json_tokenizer.py): whatever its
logits prefer, every answer must parse against its schema. Refusals are checked without a server.
"""

from __future__ import annotations

import functools
import json
from typing import Literal

import jsonschema
import pytest
from conftest import tampered_copy
from test_token_grammar import SHAPES

pytest.importorskip("ray.serve")
pytest.importorskip("llguidance")
from starlette.testclient import TestClient  # noqa: E402
from test_serve_http import asgi, completion_server  # noqa: E402

from aotc_runtime.serve.chat import parse_chat  # noqa: E402
from aotc_runtime.serve.protocol import RequestError  # noqa: E402

pytestmark = pytest.mark.slow  # builds the package

# A template that ignores `tools` (aotc describes them in a system message), and one that renders
# them itself, as tool-calling models' templates do
PLAIN_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
TOOLS_TEMPLATE = "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}" + PLAIN_TEMPLATE
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in (WEATHER, TIME)}


def chat_copy(generation_packages, name: str, template: str):
    from conftest import shared_store

    plain = generation_packages.with_json_tokenizer()[0]
    target = generation_packages.root / name

    def edit(manifest):
        manifest["generation"]["chat_template"] = "chat_template.jinja"
        manifest["generation"]["eos_token_ids"] = [0]  # the tokenizer's <eos>

    def write(folder):
        (folder / "chat_template.jinja").write_text(template)

    shared_store.once(target, lambda: tampered_copy(plain, target, edit=edit, files=write))
    return target


@pytest.fixture(scope="module")
def json_chat(generation_packages):
    return chat_copy(generation_packages, "json_chat_pkg", PLAIN_TEMPLATE)


@pytest.fixture(scope="module")
def http(json_chat):
    with TestClient(asgi(completion_server(json_chat))) as client:
        yield client


@pytest.fixture(scope="module")
def client(http):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http)


def ask(client, **options):
    options.setdefault("messages", MESSAGES)
    options.setdefault("max_tokens", 200)
    return client.chat.completions.create(model="json_chat_pkg", **options)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_shape_of_schema_answers_valid_json_greedy_and_sampled(client, shape):
    schema = SHAPES[shape]
    response_format = {"type": "json_schema", "json_schema": {"name": shape, "schema": schema}}
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 11}):
        answer = ask(client, response_format=response_format, **sampling)
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_mode_holds_answers_to_an_object_and_free_answers_stay_free(client, json_chat):
    """json_object allows any object, so a model with random weights writes one key forever: the
    grammar is read here on texts instead (the engine's rows are tested in test_token_grammar)."""
    import aotc_runtime
    from aotc_runtime.chat_template import ChatTemplate

    package = aotc_runtime.load(json_chat)
    body = json.dumps({"messages": MESSAGES, "response_format": {"type": "json_object"}})
    request = parse_chat(
        body.encode(), package.generation, package.tokenizer, ChatTemplate.of_package(package),
        lambda: vocabulary(package),
    )  # fmt: skip
    grammar = request.choices[0].request.grammar
    for text, parses in (('{"a": [1, {"b": null}], "c": "d"}', True), ("[1, 2]", False)):
        matcher = grammar.matcher()
        taken = all(matcher.take(t) for t in package.tokenizer.encode(text).ids)
        assert (taken and matcher.done) == parses, text
    free = ask(client, max_tokens=12, temperature=0).choices[0].message.content
    with pytest.raises(ValueError):  # random weights: the same prompt unconstrained is no JSON
        json.loads(free)


def test_the_openai_clients_parse_fills_a_pydantic_model(client):
    from pydantic import BaseModel, Field

    class Forecast(BaseModel):
        city: str = Field(max_length=8)
        unit: Literal["celsius", "fahrenheit"]
        days: int = Field(ge=1, le=7)

    answer = client.chat.completions.parse(
        model="json_chat_pkg", messages=MESSAGES, response_format=Forecast, max_tokens=200
    )
    parsed = answer.choices[0].message.parsed
    assert isinstance(parsed, Forecast) and 1 <= parsed.days <= 7


def test_a_named_tool_is_called_with_arguments_valid_against_its_parameters(client):
    answer = ask(
        client,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.id.startswith("call_") and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])


def test_parallel_calls_cut_at_the_last_token_keep_the_complete_ones(client):
    """With parallel calls a model with random weights never ends (it could always call once
    more): the answer cut at max_tokens holds the calls completed before the cut."""
    for stream in (False, True):
        options = {"tools": [WEATHER, TIME], "tool_choice": "required", "temperature": 0}
        if stream:
            chunks = list(ask(client, max_tokens=120, stream=True, **options))
            calls = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or [])]
            finish = chunks[-1].choices[0].finish_reason
        else:
            choice = ask(client, max_tokens=120, **options).choices[0]
            calls, finish = choice.message.tool_calls, choice.finish_reason
        assert finish == "length" and len(calls) >= 2, (stream, calls)
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_without_parallel_calls_makes_exactly_one_call(client):
    for seed in range(3):
        answer = ask(
            client, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
            temperature=1.0, seed=seed,
        )  # fmt: skip
        (call,) = answer.choices[0].message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_streamed_tool_calls_come_whole_in_openais_chunks(client):
    options = {"tools": [WEATHER], "tool_choice": "required", "temperature": 0}
    options["parallel_tool_calls"] = False
    whole = ask(client, **options).choices[0].message.tool_calls
    chunks = list(ask(client, stream=True, **options))
    calls = [call for chunk in chunks for call in (chunk.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole
    ]
    assert [c.index for c in calls] == list(range(len(calls)))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_answers_either_text_or_calls_that_parse(client):
    """With "auto" the model chooses: free text that starts no call, or calls held to the
    tools' schemas; never a call cut or malformed."""
    for seed in range(4):
        choice = ask(
            client, tools=[WEATHER], parallel_tool_calls=False, temperature=1.0, seed=seed,
            max_tokens=60,
        ).choices[0]  # fmt: skip
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
        else:
            assert not choice.message.content.startswith("<tool_call>")


def test_a_conversation_with_a_call_and_its_result_goes_on(client):
    """An assistant's tool_calls and the tool's answer, as agents send them back."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}  # fmt: skip
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees"},
    ]
    answer = ask(client, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=5)
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_langchain_binds_tools_and_fills_a_structured_output(http, json_chat):
    langchain_openai = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        """The weather in a city."""

        city: str = Field(max_length=8)
        unit: Literal["celsius", "fahrenheit"]

    chat = langchain_openai.ChatOpenAI(
        base_url="http://testserver/v1", api_key="unused", model="json_chat_pkg",
        http_client=http, max_tokens=200, temperature=0,
    )  # fmt: skip
    bound = chat.bind_tools([Weather], tool_choice="Weather", parallel_tool_calls=False)
    message = bound.invoke("Weather in Oslo?")
    (call,) = message.tool_calls
    assert call["name"] == "Weather" and Weather(**call["args"])
    # json_mode sends json_object, any object: a model with random weights writes one key forever
    # (the mode's grammar is tested on texts above)
    for method in ("json_schema", "function_calling"):
        structured = chat.with_structured_output(Weather, method=method)
        assert isinstance(structured.invoke("Weather in Oslo?"), Weather), method


def test_a_template_that_renders_tools_shows_them_and_one_that_does_not_gets_them_in_words(
    generation_packages, json_chat
):
    import aotc_runtime
    from aotc_runtime.chat_template import ChatTemplate

    body = json.dumps({"messages": MESSAGES, "tools": [WEATHER]}).encode()
    for name, template, expected in (
        ("json_chat_pkg", PLAIN_TEMPLATE, "<tool_call>"),
        ("json_tools_pkg", TOOLS_TEMPLATE, '<tools>[{"type": "function"'),
    ):
        package = aotc_runtime.load(chat_copy(generation_packages, name, template))
        words = functools.partial(vocabulary, package)
        request = parse_chat(
            body, package.generation, package.tokenizer, ChatTemplate.of_package(package), words
        )
        prompt = package.tokenizer.decode(list(request.prompt_ids))
        assert expected in prompt and "get_weather" in prompt, prompt


def vocabulary(package):
    from aotc_runtime.token_grammar import Vocabulary

    generation = package.generation
    return Vocabulary(package.tokenizer, generation.vocab_size, generation.eos_token_ids)


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"response_format": {"type": "xml"}}, "response_format", "'response_format' is {\"type\": \"xml\"}; send"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs 'json_schema'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
         "response_format", "'response_format.json_schema.name' is \"a b\""),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "response_format", "the JSON schema cannot constrain generation: Invalid type: strin"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["x" * 70_000]}}}},
         "response_format", "above the 65,536 taken"),
        ({"tools": {"get_weather": {}}}, "tools", "'tools' must be a list of"),
        ({"tools": [{"type": "function"}]}, "tools", "tool 0 is {\"type\": \"function\"}; each tool is"),
        ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools",
         "tool 0's name is \"get weather\""),
        ({"tools": [WEATHER, WEATHER]}, "tools", "'tools' names 'get_weather' twice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]},
         "tools", "cannot constrain generation"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice", "'tool_choice' names 'nope', which 'tools' does not list"),
        ({"tool_choice": "required"}, "tool_choice", "'tool_choice' is 'required' but 'tools' lists none"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "'tool_choice' is \"sometimes\"; send"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "must be true or false"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": 1}]}]},
         "messages", "an assistant message's 'tool_calls' hold"),
    ],
)  # fmt: skip
def test_bad_schemas_and_tool_definitions_are_refused_by_name(json_chat, fields, param, words):
    import aotc_runtime
    from aotc_runtime.chat_template import ChatTemplate

    package = aotc_runtime.load(json_chat)
    body = json.dumps({"messages": MESSAGES, **fields}).encode()
    with pytest.raises(RequestError) as caught:
        parse_chat(
            body, package.generation, package.tokenizer, ChatTemplate.of_package(package),
            lambda: vocabulary(package),
        )  # fmt: skip
    assert caught.value.status == 400 and caught.value.param == param, caught.value
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_bad_schema_reaches_the_client_in_openais_error_shape(http):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}
    reply = http.post("/v1/chat/completions", json={"messages": MESSAGES, "response_format": bad})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "response_format" and error["code"] == "invalid_schema"
    assert error["type"] == "invalid_request_error" and "Invalid type: strin" in error["message"]
