"""The HTTP protocol of `aotc serve`: a request body -> the package's input tensors, checked against
its signature; the outputs -> a response body. No server here: every replica answers with the same
checks, and they are tested without one.

Requests (`POST /v1/predict`):
- JSON (`Content-Type: application/json`, the default): `{"inputs": {"name": nested list, ...}}`, or
  `{"inputs": [nested list, ...]}` in the signature's order. Dtypes come from the signature; an
  integer or bool input refuses non-integer values instead of truncating them.
- `.npz` bytes (`Content-Type: application/x-npz`): one array per input, named after it (any
  order), or arr_0, arr_1, ... in the signature's order; any other names, a name twice or an input
  missing is refused, naming the inputs. Dtypes must be the signature's. Read by aotc_runtime.npz:
  entry count, names, each array's declared dtype and shape, and their bytes against the limit are
  checked before any entry is decompressed, and nothing in a request runs.

The limit (`max_bytes`, `--max-body-mb`) applies to the body as sent and to the inputs it unpacks
to (elements x dtype size): a small .npz of zeros that inflates past it is refused before it is
inflated. A JSON body is counted before it is parsed (json.loads makes an object of every list and
number: 60 MB of empty lists took 1.5 GB): no more lists and values than the inputs hold at their
largest shapes, and no more values than the limit's bytes hold at the inputs' smallest dtype.

Every refusal is a RequestError with an HTTP status and the one-line message the CLI would print:
400 (bad JSON, an empty body, wrong names, counts, shapes or dtypes), 413 (a body or its inputs
above the limit), 415 (another content type). Its body is OpenAI's error shape (error_body):
`{"error": {"message": "<one line>", "type": "invalid_request_error", "param": null, "code":
null}}`, on every route of the server.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from aotc_runtime import Signature, TensorSpec

JSON_TYPE = "application/json"
NPZ_TYPE = "application/x-npz"
FORM_TYPE = "application/x-www-form-urlencoded"
# the Ray Serve deployments aotc serve makes: a package answering one call per request
# (replica.py), and a text-generation package (completion_server.py)
MODEL_DEPLOYMENT, COMPLETIONS_DEPLOYMENT = "aotc-model", "aotc-completions"
# How often a stopping replica asks whether it still answers a request. Ray Serve waits this long
# before its first look (2 s by default), so that routers drop the replica first; on stop every
# deployment of the application goes at once and no router sends it more, so a short wait loop
# takes Ctrl-C from about 3 s of draining to under 1 s.
DRAIN_CHECK_S = 0.25
DEFAULT_MAX_BODY_BYTES = 64 << 20  # `aotc serve --max-body-mb`
# `aotc serve --max-answer-mb`: the bytes one request's answer may take, whole or streamed. A
# 150-byte request can ask for n=128 answers of the whole cache with 20 top logprobs each (100 MB
# and more); and a stream its client does not read is held by Ray Serve's proxy, which takes
# every event the replica sends, whatever the client's socket takes (docs/usage.md)
DEFAULT_MAX_ANSWER_BYTES = 32 << 20
# Lists and values (a comma each) a JSON body may hold beyond its inputs': other keys, and commas or
# brackets inside the names
JSON_ALLOWANCE = 64
LARGER = "send smaller batches (or start the server with a larger --max-body-mb)"


# OpenAI's error types: a request at fault (any 4xx, an unknown model too), or the server
CLIENT_ERROR, SERVER_ERROR = "invalid_request_error", "server_error"


class RequestError(Exception):
    """A request the server refuses: `status` is the HTTP status, the message says why and what to
    send; `param` the request field at fault (None: the request as a whole), `code` a short
    machine-readable reason (None when the status says enough)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict:
        return error_body(self.status, str(self), self.param, self.code)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    """Every error aotc serve answers, whole or streamed, in OpenAI's shape: {"error": {"message":
    one line, "type", "param", "code"}}."""
    kind = CLIENT_ERROR if status < 500 else SERVER_ERROR
    line = " ".join(message.split())  # one line, whatever the message held
    return {"error": {"message": line, "type": kind, "param": param, "code": code}}


# The longest line of an exception's text an answer repeats: text longer than that (it may quote
# what a client sent) is left out, never cut mid-value
SAID_MAX = 200


def said_whole(text: str) -> str | None:
    """The first line of an exception's text when it is at most SAID_MAX characters (an answer
    repeats it whole), else None (the answer names the exception's type alone)."""
    lines = text.strip().splitlines()
    return lines[0] if lines and len(lines[0]) <= SAID_MAX else None


def body_too_large(size: int | str, max_bytes: int) -> RequestError:
    """413 for a body of `size` bytes (a number, or "more than N" while it is still arriving)."""
    return RequestError(
        413,
        f"request body is {size} bytes, above this server's limit of {max_bytes}; {LARGER}",
        code="request_too_large",
    )


def media_type(content_type: str | None) -> str:
    """'application/json; charset=utf-8' -> 'application/json'; none given -> JSON."""
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind or JSON_TYPE


def decode_request(
    body: bytes,
    content_type: str | None,
    signature: Signature,
    max_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> list[torch.Tensor]:
    """The input tensors of a request, in the signature's order, checked against it."""
    from aotc_runtime import InputMismatchError

    if len(body) > max_bytes:
        raise body_too_large(len(body), max_bytes)
    if not body:
        raise RequestError(
            400, 'empty request body; send {"inputs": {...}} as JSON, or .npz bytes with '
            f"Content-Type: {NPZ_TYPE}",
        )  # fmt: skip
    kind = media_type(content_type)
    if kind == JSON_TYPE:
        tensors = _from_json(body, signature, max_bytes)
    elif kind == NPZ_TYPE:
        tensors = _from_npz(body, signature, max_bytes)
    else:
        # curl -d sends a JSON body under this type unless told otherwise
        hint = (
            " (curl -d sends it: add -H 'Content-Type: application/json')"
            if kind == FORM_TYPE
            else ""
        )
        raise RequestError(
            415, f"Content-Type {kind} is not served{hint}; use {JSON_TYPE} or {NPZ_TYPE}"
        )
    try:
        signature.check_inputs(tensors)
    except InputMismatchError as exc:
        raise RequestError(400, str(exc)) from None
    return tensors


def _from_json(body: bytes, signature: Signature, max_bytes: int) -> list:
    _check_json_counts(body, signature, max_bytes)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        # their texts are Python's words, a byte and positions: short, and whole
        raise RequestError(
            400, f"request body is not valid JSON ({type(exc).__name__}: {exc})"
        ) from None
    shape_hint = '{"inputs": {"name": nested list, ...}} or {"inputs": [nested list, ...]}'
    if not isinstance(data, dict) or "inputs" not in data:
        raise RequestError(400, f"the JSON body must be {shape_hint}")
    given = data["inputs"]
    specs = signature.inputs
    names = [spec.name for spec in specs]
    if isinstance(given, dict):
        unknown = [name for name in given if name not in names]
        missing = [name for name in names if name not in given]
        if unknown or missing:
            parts = ([f"unknown input(s) {', '.join(map(str, unknown))}"] if unknown else []) + (
                [f"missing input(s) {', '.join(missing)}"] if missing else []
            )
            raise RequestError(400, f"{'; '.join(parts)}; the package takes {', '.join(names)}")
        values = [given[name] for name in names]
    elif isinstance(given, list):
        if len(given) != len(specs):
            raise RequestError(
                400,
                f"{len(given)} input(s) given, the package takes {len(specs)} ({', '.join(names)})",
            )
        values = given
    else:
        raise RequestError(400, f"the JSON body must be {shape_hint}")
    tensors = [_tensor(value, spec) for value, spec in zip(values, specs)]
    size = sum(t.numel() * t.element_size() for t in tensors)
    if size > max_bytes:
        raise RequestError(
            413,
            f"the request's inputs are {size} bytes as the signature's dtypes, above this "
            f"server's limit of {max_bytes}; {LARGER}",
        )
    return tensors


def _check_json_counts(body: bytes, signature: Signature, max_bytes: int) -> None:
    """Refuse, before json.loads builds them, more lists or values than the inputs can take.

    Counting `[` and `,` in the bytes is a C-speed scan; every list holds one value per comma
    plus one, so lists + commas bound the values parsing would make.
    """
    most_lists, most_values, smallest = _json_bounds(signature)
    lists = body.count(b"[")
    if lists > most_lists:
        raise RequestError(
            400,
            f"the JSON body holds {lists} lists, more than the package's inputs hold at their "
            f"largest shapes ({most_lists}); send one nested list per input, shaped as "
            "/v1/metadata's signature says",
        )
    values = lists + body.count(b",")
    if values > most_values:
        raise RequestError(
            400,
            f"the JSON body holds {values} values (lists and numbers), more than the package's "
            f"inputs hold at their largest shapes ({most_values}); send one nested list per "
            "input, shaped as /v1/metadata's signature says",
        )
    if values * smallest > max_bytes + JSON_ALLOWANCE * smallest:
        raise RequestError(
            413,
            f"the JSON body holds about {values} values (lists and numbers), {values * smallest} bytes "
            f"or more as the inputs' dtypes, above this server's limit of {max_bytes}; {LARGER}, "
            f"or send .npz ({NPZ_TYPE})",
        )


def _json_bounds(signature: Signature) -> tuple[int, int, int]:
    """(lists, values, smallest itemsize) the JSON of the inputs at their largest shapes holds."""
    from aotc_runtime import DTYPES

    lists, elements = 1 + JSON_ALLOWANCE, JSON_ALLOWANCE  # 1: the list of inputs given by position
    for spec in signature.inputs:
        # one list for each index into all but the last dim: 1 + d0 + d0*d1 + ...
        prefix = 1
        for entry in spec.shape:
            lists += prefix
            prefix *= entry if isinstance(entry, int) else signature.dims[entry]["max"]
        elements += prefix
    smallest = min((DTYPES[spec.dtype].itemsize for spec in signature.inputs), default=1)
    return lists, lists + elements, smallest


def _tensor(value: object, spec: TensorSpec) -> torch.Tensor:
    """A nested list as the spec's dtype; non-integer values for an integer or bool input refused."""
    import torch

    from aotc_runtime import DTYPES

    dtype = DTYPES[spec.dtype]
    try:
        inferred = torch.tensor(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        first = said_whole(str(exc)) or type(exc).__name__
        raise RequestError(
            400, f"input {spec.name} is not a nested list of numbers with one shape ({first})"
        ) from None
    wants_integers = not dtype.is_floating_point
    if (wants_integers and inferred.is_floating_point()) or (
        dtype == torch.bool and inferred.dtype != torch.bool
    ):
        got = "numbers" if dtype == torch.bool else "non-integer values"
        raise RequestError(
            400, f"input {spec.name} has dtype {spec.dtype} in the package's signature but the request "
            f"gives {got}; send {'true/false' if dtype == torch.bool else 'integers'}",
        )  # fmt: skip
    try:
        return inferred.to(dtype)
    except RuntimeError as exc:
        said = said_whole(str(exc)) or f"torch could not convert it to {spec.dtype}"
        raise RequestError(400, f"input {spec.name}: {said}") from None


def _from_npz(body: bytes, signature: Signature, max_bytes: int) -> list:
    import torch

    from aotc_runtime import InputMismatchError, InputTooLargeError, read_npz

    try:
        arrays = read_npz(io.BytesIO(body), signature, "request body", max_bytes=max_bytes)
    except InputTooLargeError as exc:
        raise RequestError(
            413,
            f"the .npz body unpacks to {exc.size} bytes of arrays, above this server's limit of "
            f"{max_bytes}; {LARGER}",
        ) from None
    except InputMismatchError as exc:
        raise RequestError(400, str(exc)) from None
    return [torch.from_numpy(arrays[index]) for index in range(len(signature.inputs))]


def encode_response(result: object, signature: Signature, kind: str) -> tuple[bytes, str]:
    """(body, content type) of a call's outputs, named by the signature, as the request was sent."""
    import torch

    from aotc_runtime import flatten_outputs

    outputs = [t.detach().cpu() for t in flatten_outputs(result)]
    names = list(signature.output_names)
    if kind == NPZ_TYPE:
        from aotc_runtime.npz import write_npz

        buffer = io.BytesIO()
        # numpy has no bfloat16: such outputs go as float32, which holds every bfloat16 value.
        write_npz(
            buffer,
            {
                name: (t.float() if t.dtype == torch.bfloat16 else t).numpy()
                for name, t in zip(names, outputs)
            },
        )
        return buffer.getvalue(), NPZ_TYPE
    body = {"outputs": {name: t.tolist() for name, t in zip(names, outputs)}}
    # NaN and infinities are written as NaN / Infinity (Python's json and most clients read them)
    return json.dumps(body).encode(), JSON_TYPE


def answer_too_large(max_bytes: int) -> RequestError:
    """400 for an answer that passed `max_bytes` while it was made (its rows are freed)."""
    return RequestError(
        400,
        f"the answer passed this server's limit of {max_bytes:,} bytes for one request; ask for "
        "fewer tokens, choices (n) or top_logprobs (or start the server with a larger "
        "--max-answer-mb)",
        code="answer_too_large",
    )
