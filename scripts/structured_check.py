"""Structured output against a running `aotc serve` of a real chat model: N requests of five schema
shapes (nested objects, arrays, enums, bounded numbers, patterns) through the `openai` client's
response_format json_schema, each answer validated against its schema; a named tool call; and the
decode cost of a constrained answer against a free one (the median gap between streamed tokens,
requests one at a time, alternating).

usage: python scripts/structured_check.py http://127.0.0.1:8000 [--requests 20] [--temperature T]
       [--rounds 3] [--out docs/bench/structured_cpu.json]
Start the server first (`aotc serve PKG --port 8000`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jsonschema
import openai

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}
SHAPES = {
    "nested": (PERSON, "Describe a person named {0} who lives in {1}, as JSON."),
    "array": (
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 2,
                    "maxItems": 5,
                }
            },
            "required": ["items"],
            "additionalProperties": False,
        },
        "List a few things to pack for a trip to {1}, as JSON.",
    ),
    "enum": (
        {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "confident": {"type": "boolean"},
            },
            "required": ["sentiment", "confident"],
            "additionalProperties": False,
        },
        "What is the sentiment of: '{0} loved the food in {1}'? Answer in JSON.",
    ),
    "bounded": (
        {
            "type": "object",
            "properties": {
                "temperature_c": {"type": "number", "minimum": -50, "maximum": 60},
                "rain_probability": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["temperature_c", "rain_probability"],
            "additionalProperties": False,
        },
        "Give a weather forecast for {1} tomorrow as JSON.",
    ),
    "pattern": (
        {
            "type": "object",
            "properties": {
                "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                "event": {"type": "string"},
            },
            "required": ["date", "event"],
            "additionalProperties": False,
        },
        "Name an event in the history of {1} and its date, as JSON.",
    ),
}
PEOPLE = [("Alice", "Paris"), ("Bob", "Tokyo"), ("Chen", "Lima"), ("Dana", "Oslo")]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def schemas(client, model: str, requests: int, sampling: dict) -> list:
    results = []
    cases = [(shape, person) for person in PEOPLE for shape in SHAPES]
    for shape, (name, city) in (cases * (1 + requests // len(cases)))[:requests]:
        schema, words = SHAPES[shape]
        started = time.perf_counter()
        answer = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": words.format(name, city)}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": shape, "schema": schema},
            },
            max_tokens=256,
            **sampling,
        )
        choice = answer.choices[0]
        try:
            jsonschema.validate(json.loads(choice.message.content), schema)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        results.append({
            "shape": shape, "valid": valid, "finish": choice.finish_reason,
            "tokens": answer.usage.completion_tokens, "seconds": time.perf_counter() - started,
            "answer": choice.message.content,
        })  # fmt: skip
        print(f"{shape:8} {'valid' if valid else 'INVALID'} {choice.message.content}", flush=True)
    return results


def tool_call(client, model: str) -> dict:
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What's the weather like in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=128,
        temperature=0,
    )
    choice = answer.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    print("tool call:", choice.finish_reason, calls, flush=True)
    return {"finish": choice.finish_reason, "calls": calls}


def token_gaps(client, model: str, constrained: bool) -> list:
    """The gaps (ms) between a streamed answer's token chunks, its first token's wait left out."""
    schema = SHAPES["nested"][0]
    extra: dict = {"extra_body": {"ignore_eos": True}}
    if constrained:
        extra = {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": schema},
            }
        }
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": SHAPES["nested"][1].format("Eve", "Rome")}],
        max_tokens=48, temperature=0, stream=True, **extra,
    )  # fmt: skip
    arrivals = [time.perf_counter() for chunk in stream if chunk.choices]
    return [(b - a) * 1000 for a, b in zip(arrivals[1:], arrivals[2:])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--temperature", default="default", help="'default' (the server's) or T")
    parser.add_argument("--repetition-penalty", type=float, help="aotc's field, sent in the body")
    parser.add_argument("--rounds", type=int, default=3, help="alternating free/constrained pairs")
    parser.add_argument("--out")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.url}/v1", api_key="unused", timeout=1800)
    model = client.models.list().data[0].id
    sampling: dict = (
        {} if args.temperature == "default" else {"temperature": float(args.temperature)}
    )
    if args.repetition_penalty is not None:
        sampling["extra_body"] = {"repetition_penalty": args.repetition_penalty}
    results = schemas(client, model, args.requests, sampling)
    valid = sum(r["valid"] for r in results)
    print(f"valid: {valid}/{len(results)}", flush=True)
    call = tool_call(client, model)
    gaps: dict = {"free": [], "constrained": []}
    for _ in range(args.rounds):
        for kind in gaps:
            gaps[kind] += token_gaps(client, model, kind == "constrained")
    medians = {kind: statistics.median(values) for kind, values in gaps.items()}
    ratio = medians["constrained"] / medians["free"]
    print(f"token gap median: free {medians['free']:.1f} ms, constrained "
          f"{medians['constrained']:.1f} ms ({ratio:.3f}x)")  # fmt: skip
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"model": model, "valid": valid, "requests": len(results),
                       "sampling": sampling or "server default", "results": results,
                       "tool_call": call, "gap_ms_median": medians, "gap_ratio": ratio}, out, indent=1)  # fmt: skip
    return 0 if valid == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
