"""The HTTP protocol of `aotc serve`: a request body -> the package's input tensors, checked against
its signature; the outputs -> a response body. No server here: every replica answers with the same
checks, and they are tested without one.

Requests (`POST /v1/predict`):
- JSON (`Content-Type: application/json`, the default): `{"inputs": {"name": nested list, ...}}`, or
  `{"inputs": [nested list, ...]}` in the signature's order. Dtypes come from the signature; an
  integer or bool input refuses non-integer values instead of truncating them.
- `.npz` bytes (`Content-Type: application/x-npz`): arrays named after the inputs (any order), or
  arr_0, arr_1, ... in the signature's order; dtypes must be the signature's. Read with
  allow_pickle=False: nothing in a request runs.

Every refusal is a RequestError with an HTTP status and the one-line message the CLI would print:
400 (bad JSON, an empty body, wrong names, counts, shapes or dtypes), 413 (a body above the limit),
415 (another content type).
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from aotc_runtime import Signature

JSON_TYPE = "application/json"
NPZ_TYPE = "application/x-npz"
FORM_TYPE = "application/x-www-form-urlencoded"
DEFAULT_MAX_BODY_BYTES = 64 << 20  # `aotc serve --max-body-mb`


class RequestError(Exception):
    """A request the server refuses: `status` is the HTTP status, the message says why and what to send."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def body_too_large(size: int | str, max_bytes: int) -> RequestError:
    """413 for a body of `size` bytes (a number, or "more than N" while it is still arriving)."""
    return RequestError(
        413,
        f"request body is {size} bytes, above this server's limit of {max_bytes}; send smaller "
        "batches (or start the server with a larger --max-body-mb)",
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
        tensors = _from_json(body, signature)
    elif kind == NPZ_TYPE:
        tensors = _from_npz(body, signature)
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


def _from_json(body: bytes, signature: Signature) -> list:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise RequestError(
            400, f"request body is not valid JSON ({type(exc).__name__}: {str(exc)[:80]})"
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
    return [_tensor(value, spec) for value, spec in zip(values, specs)]


def _tensor(value: object, spec) -> torch.Tensor:
    """A nested list as the spec's dtype; non-integer values for an integer or bool input refused."""
    import torch

    from aotc_runtime import DTYPES

    dtype = DTYPES[spec.dtype]
    try:
        inferred = torch.tensor(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        first = str(exc).strip().splitlines()[0][:80] if str(exc).strip() else type(exc).__name__
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
        raise RequestError(400, f"input {spec.name}: {str(exc)[:80]}") from None


def _from_npz(body: bytes, signature: Signature) -> list:
    import numpy
    import torch

    try:
        with numpy.load(io.BytesIO(body), allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as exc:  # numpy raises several kinds for a damaged archive
        raise RequestError(
            400, f"request body is not a readable .npz ({type(exc).__name__}: {str(exc)[:80]})"
        ) from None
    names = [spec.name for spec in signature.inputs]
    if set(arrays) <= set(names) and arrays:
        ordered = [arrays[name] for name in names if name in arrays]
    else:
        ordered = list(arrays.values())
    try:
        return [torch.from_numpy(array) for array in ordered]
    except TypeError as exc:  # a dtype torch has no tensor for (strings, objects)
        raise RequestError(400, f"an .npz array has a dtype torch cannot take ({exc})") from None


def encode_response(result: object, signature: Signature, kind: str) -> tuple[bytes, str]:
    """(body, content type) of a call's outputs, named by the signature, as the request was sent."""
    import torch

    from aotc_runtime import flatten_outputs

    outputs = [t.detach().cpu() for t in flatten_outputs(result)]
    names = list(signature.output_names)
    if kind == NPZ_TYPE:
        import numpy

        buffer = io.BytesIO()
        # numpy has no bfloat16: such outputs go as float32, which holds every bfloat16 value
        arrays = {
            name: (t.float() if t.dtype == torch.bfloat16 else t).numpy()
            for name, t in zip(names, outputs)
        }
        numpy.savez(buffer, **arrays)
        return buffer.getvalue(), NPZ_TYPE
    body = {"outputs": {name: t.tolist() for name, t in zip(names, outputs)}}
    # NaN and infinities are written as NaN / Infinity (Python's json and most clients read them)
    return json.dumps(body).encode(), JSON_TYPE
