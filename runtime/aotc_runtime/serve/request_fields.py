"""The fields `/v1/completions` and `/v1/chat/completions` share, read from a request body and
checked: how to decode (max tokens, sampling, penalties, seed, `n`, stops, `ignore_eos`,
logprobs) and how to answer (`stream`, `stream_options`, `model`). No server and no model here.

Each value is checked where its meaning lives, once: the sampling fields (named as the runtime's
Sampling names them) by making a Sampling of them, which checks itself (the ranges `aotc
generate`, the Python API and the C++ runner accept); the prompt and max_tokens against the
package by making the runtime's GenerationRequest and checking it (GenerationRequest.check), which
the decode engine then does not repeat. A refusal is a 400 naming the field (its `param`) and what
to send instead. An explicit null means the field's default, as OpenAI reads it.

`n` answers per prompt (OpenAI's, and vLLM's parallel sampling): with a seed, answer j draws from
seed + j, so the answers differ from each other but repeat run to run, and answer 0 is the
request's answer with n 1; without one, each answer draws a fresh seed.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass
from typing import Any

from aotc_runtime.sampling_settings import SAMPLING_FIELDS, InvalidSampling, Sampling
from aotc_runtime.serve.protocol import RequestError

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_N = 128  # OpenAI's limit on `n`
MAX_CHOICES = 128  # answers of one request in all (prompts x n): each is a row's work
SEED_SPACE = 2**64
# OpenAI's sampling defaults, for a package that records none of its own
OPENAI_SAMPLING = Sampling(temperature=1.0)
# the fields both endpoints take: the sampling settings (named as Sampling names them), then how
# to decode and answer (`user` is taken and not used, as vLLM takes it)
SHARED_FIELDS = (*SAMPLING_FIELDS, "n", "stop", "ignore_eos", "stream", "stream_options",
                 "model", "user")  # fmt: skip


# The longest value or field name a refusal quotes; a longer one is described instead, never cut
# mid-value (a refusal that quoted the first 40 characters of a tools list read as garbage)
SHOWN_MAX = 60


def shown(value: Any) -> str:
    """A value as JSON on one line, whatever a client sent (ASCII: a lone surrogate becomes its
    escape instead of failing to encode), whole when it is short; else what it is (a list of 3
    items, an object of 2 keys, a string of 900 characters)."""
    text = json.dumps(value)
    if len(text) <= SHOWN_MAX:
        return text
    if isinstance(value, (list, dict, str)):
        count = len(value)
        kind = {
            list: ("a list", "item"),
            dict: ("an object", "key"),
            str: ("a string", "character"),
        }
        what, unit = kind[type(value)]
        return f"{what} of {count:,} {unit}{'' if count == 1 else 's'}"
    return f"a number of {len(text):,} digits"


def shown_name(name: str) -> str:
    """A field name a client sent, quoted whole when it is short; else its length."""
    if len(name) <= SHOWN_MAX and name.isprintable():
        return f"'{name}'"
    return f"a name of {len(name):,} characters"


def json_object(body: bytes, example: str) -> dict:
    """The body as a JSON object; `example` shows the smallest request in the refusal."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"request body is not JSON ({exc}); send a JSON object") from None
    except RecursionError:  # json.loads recurses once per level: a body of "[[[[..." stops it
        raise RequestError(
            400, "request body nests too deeply to be a completion; send a flat JSON object"
        ) from None
    if not isinstance(data, dict):
        raise RequestError(400, f"request body is not a JSON object; send {example}")
    return data


def check_fields(data: dict, fields: tuple, neutral: dict, what: str) -> None:
    """Every key is a field of `fields`, or one of `neutral` at its neutral value (or null): a
    client that always sends such a field works, and one that needs it is refused rather than
    answered as if it had not asked."""
    for key, value in data.items():
        if key in neutral:
            if value is not None and value not in neutral[key]:
                raise RequestError(
                    400,
                    f"'{key}' is {shown(value)}; this server supports only "
                    f"{json.dumps(neutral[key][0])} (leave it out)",
                    param=key,
                )
        elif key not in fields:
            raise RequestError(
                400, f"unknown field {shown_name(key)}; {what} takes {', '.join(fields)}", param=key
            )


def value(data: dict, key: str, default: Any) -> Any:
    """The field's value; absent or null (OpenAI's nullable fields) -> its default."""
    given = data.get(key)
    return default if given is None else given


def integer(data: dict, key: str, default: Any, low: int, high: int | None = None) -> Any:
    given = value(data, key, default)
    if given is None:
        return None
    if (
        not isinstance(given, int)
        or isinstance(given, bool)
        or given < low
        or (high is not None and given > high)
    ):
        bound = f">= {low}" if high is None else f"from {low} to {high}"
        raise RequestError(
            400, f"'{key}' must be a whole number {bound}; got {shown(given)}", param=key
        )
    return given


def boolean(data: dict, key: str, default: bool) -> bool:
    given = value(data, key, default)
    if not isinstance(given, bool):
        raise RequestError(400, f"'{key}' must be true or false; got {shown(given)}", param=key)
    return given


def text(data: dict, key: str) -> str | None:
    given = data.get(key)
    if given is not None and not isinstance(given, str):
        raise RequestError(400, f"'{key}' must be a string; got {shown(given)}", param=key)
    return given


def read_sampling(data: dict, defaults: Sampling) -> Sampling:
    """The request's sampling fields over `defaults` (those it leaves out or sends as null), as one
    Sampling: made, so checked, once. A refusal names the field the Sampling names."""
    given = {key: data[key] for key in SAMPLING_FIELDS if data.get(key) is not None}
    try:
        return dataclasses.replace(defaults, **given)
    except InvalidSampling as exc:
        why, value = str(exc), given.get(exc.field)
        if len(repr(value)) > SHOWN_MAX:  # the runtime's words quote it whole (its repr)
            why = why.replace(repr(value), shown(value))
        raise RequestError(400, f"'{exc.field}': {why}", param=exc.field) from None


def check_unicode(string: str, key: str) -> None:
    """JSON may carry a lone surrogate ("\\ud800"), which is no character: the tokenizer cannot
    take it (it raised, and the client got a plain-text 500)."""
    try:
        string.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(
            400,
            f"'{key}' holds a lone UTF-16 surrogate ({shown(string[exc.start])} at character "
            f"{exc.start}), which is not text; send valid Unicode (a surrogate pair, or UTF-8)",
            param=key,
        ) from None


def stops(given: Any, tokenizer: Any) -> tuple:
    """`stop`: a string or a list of up to 4; text, so the package's tokenizer reads it."""
    if given is None:
        return ()
    listed = [given] if isinstance(given, str) else given
    if not isinstance(listed, list) or not all(isinstance(s, str) and s for s in listed):
        raise RequestError(400, "'stop' must be a non-empty string or a list of them", param="stop")
    if len(listed) > MAX_STOP:
        raise RequestError(
            400, f"'stop' holds {len(listed)} strings; send at most {MAX_STOP}", param="stop"
        )
    if tokenizer is None:
        raise RequestError(
            400,
            "'stop' needs text, but this package carries no tokenizer; leave 'stop' out",
            param="stop",
        )
    for string in listed:
        check_unicode(string, "stop")
    return tuple(listed)


def include_usage(data: dict, stream: bool) -> bool:
    """`stream_options`: {"include_usage": bool}, only with `stream` (as OpenAI and vLLM refuse
    it otherwise: a whole answer always carries its usage)."""
    options = data.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise RequestError(
            400, "'stream_options' applies only with \"stream\": true; leave it out",
            param="stream_options",
        )  # fmt: skip
    if not isinstance(options, dict) or not set(options) <= {"include_usage"}:
        raise RequestError(
            400, f"'stream_options' must be {{\"include_usage\": true or false}}; got "
            f"{shown(options)}", param="stream_options",
        )  # fmt: skip
    return boolean(options, "include_usage", False)


@dataclass(frozen=True, kw_only=True)
class Decoding:
    """How a request's answers are decoded and sent, whichever endpoint took it."""

    max_tokens: int
    sampling: Sampling  # the request's, the model's defaults where it named none
    n: int = 1
    stop: tuple = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    stream: bool = False
    include_usage: bool = False
    model: str | None = None

    def seeds(self) -> list:
        """Each of the n answers' seed (see the module's text); None for greedy answers."""
        if self.sampling.greedy:
            return [None] * self.n
        if self.sampling.seed is None:
            return [secrets.randbits(63) for _ in range(self.n)]
        return [(self.sampling.seed + j) % SEED_SPACE for j in range(self.n)]


def read_decoding(
    data: dict, tokenizer: Any, max_tokens: int, generation: Any, logprobs: int | None
) -> Decoding:
    """The shared fields of `data`; `max_tokens` and `logprobs` are the values the endpoint read
    (its own names and defaults). A sampling field the request leaves out takes the model's
    default (`generation.default_sampling()`: its generation_config, greedy when it does not
    sample, as transformers' `generate`), so `aotc serve` and `aotc chat` answer alike; OpenAI's
    (temperature 1.0) without a package's record."""
    defaults = (
        generation.default_sampling()
        if hasattr(generation, "default_sampling")
        else OPENAI_SAMPLING
    )
    stream = boolean(data, "stream", False)
    return Decoding(
        max_tokens=max_tokens,
        sampling=read_sampling(data, defaults),
        n=integer(data, "n", 1, low=1, high=MAX_N),
        stop=stops(data.get("stop"), tokenizer),
        ignore_eos=boolean(data, "ignore_eos", False),
        logprobs=logprobs,
        stream=stream,
        include_usage=include_usage(data, stream),
        model=text(data, "model"),
    )


@dataclass(frozen=True)
class Choice:
    """One answer a request asks for: what one row of the running batch generates. `index` is
    OpenAI's: prompt i's answer j is i * n + j."""

    index: int
    prompt_index: int
    request: Any  # aotc_runtime's GenerationRequest


def make_choices(
    prompts: list,
    decoding: Decoding,
    max_tokens: list,
    generation: Any,
    prompt_param: str,
    grammar: Any = None,
) -> tuple:
    """Every answer of the request, prompt by prompt, n each, each checked against the package
    (the runtime's words: its vocabulary, its KV cache). `max_tokens[i]`: prompt i's; `grammar`
    (token_grammar.TokenGrammar) holds every answer's text to it."""
    from aotc_runtime.errors import GenerationInputError
    from aotc_runtime.generation_request import GenerationRequest

    if len(prompts) * decoding.n > MAX_CHOICES:
        raise RequestError(
            400,
            f"{len(prompts)} prompt(s) x n {decoding.n} ask for {len(prompts) * decoding.n} "
            f"answers; send at most {MAX_CHOICES} in one request",
            param="n",
        )
    extra: dict = {}
    if decoding.ignore_eos:
        extra["ignore_eos"] = True
    if decoding.logprobs is not None:
        extra["logprobs"] = decoding.logprobs
    if grammar is not None:
        extra["grammar"] = grammar
    choices = []
    for i, (prompt, most) in enumerate(zip(prompts, max_tokens)):
        for j, seed in enumerate(decoding.seeds()):
            sampling = dataclasses.replace(decoding.sampling, seed=seed)
            try:  # made and checked against the package: the engine checks it no more
                request = GenerationRequest(
                    tuple(prompt), most, sampling, stop=decoding.stop, **extra
                ).check(generation)
            except GenerationInputError as exc:
                words = str(exc)
                at_prompt = words.startswith(("token id", "the prompt is empty"))
                raise RequestError(
                    400, words, param=prompt_param if at_prompt else "max_tokens"
                ) from None
            choices.append(Choice(i * decoding.n + j, i, request))
    return tuple(choices)
