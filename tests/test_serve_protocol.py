"""The request/response format of `aotc serve` (runtime/aotc_runtime/serve/protocol.py), without a
server: each refusal's HTTP status and message, JSON and .npz round trips against known tensors."""

from __future__ import annotations

import io
import json

import numpy
import pytest
import torch

from aotc_runtime import Signature
from aotc_runtime.serve.protocol import (
    NPZ_TYPE,
    SAID_MAX,
    RequestError,
    decode_request,
    encode_response,
    media_type,
    said_whole,
)

SIGNATURE = Signature.from_json(
    {
        "inputs": [
            {"name": "ids", "dtype": "int64", "shape": ["B", 4], "value_range": [0, 99]},
            {"name": "scale", "dtype": "float32", "shape": ["B", 1]},
        ],
        "outputs": [{"name": "out", "dtype": "float32", "shape": ["B", 4]}],
        "dims": {"B": {"min": 1, "max": 8, "example": 2}},
        "output_structure": "tensor",
    }
)


def body(data) -> bytes:
    return json.dumps(data).encode()


def test_json_by_name_and_by_position_give_the_signatures_dtypes():
    named = {"inputs": {"scale": [[0.5], [2.0]], "ids": [[1, 2, 3, 4], [5, 6, 7, 8]]}}
    positional = {"inputs": [[[1, 2, 3, 4], [5, 6, 7, 8]], [[0.5], [2.0]]]}
    for request in (named, positional):
        ids, scale = decode_request(body(request), "application/json; charset=utf-8", SIGNATURE)
        assert ids.dtype == torch.int64 and ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
        assert scale.dtype == torch.float32 and scale.tolist() == [[0.5], [2.0]]


def test_integers_are_accepted_for_a_float_input():
    _ids, scale = decode_request(body({"inputs": [[[1, 2, 3, 4]], [[3]]]}), None, SIGNATURE)
    assert scale.dtype == torch.float32 and scale.item() == 3.0


def test_npz_by_name_round_trip():
    buffer = io.BytesIO()
    ids = numpy.arange(8, dtype=numpy.int64).reshape(2, 4)
    scale = numpy.ones((2, 1), dtype=numpy.float32)
    numpy.savez(buffer, scale=scale, ids=ids)  # names in another order than the signature's
    got = decode_request(buffer.getvalue(), NPZ_TYPE, SIGNATURE)
    assert torch.equal(got[0], torch.from_numpy(ids)) and torch.equal(
        got[1], torch.from_numpy(scale)
    )


@pytest.mark.parametrize(
    "raw, content_type, status, message",
    [
        (b"", None, 400, "empty request body"),
        (b"{not json", None, 400, "not valid JSON"),
        (b'{"data": []}', None, 400, 'the JSON body must be {"inputs"'),
        (body({"inputs": {"ids": [[1, 2, 3, 4]]}}), None, 400, "missing input(s) scale"),
        (body({"inputs": {"ids": [[1, 2, 3, 4]], "scale": [[1.0]], "x": 1}}), None, 400, "unknown input(s) x"),
        (body({"inputs": [[[1, 2, 3, 4]]]}), None, 400, "1 input(s) given, the package takes 2"),
        (body({"inputs": [[[1, 2, 3]], [[1.0]]]}), None, 400, "ids"),  # wrong shape: the CLI's message
        (body({"inputs": [[[1.5, 2, 3, 4]], [[1.0]]]}), None, 400, "dtype int64 in the package's signature"),
        (body({"inputs": [[[1, 2], [3]], [[1.0]]]}), None, 400, "one shape"),
        (body({"inputs": [[[1, 2, 3, 4]] * 9, [[1.0]] * 9]}), None, 400, "outside 1..8"),
        (b"PK\x03\x04broken", NPZ_TYPE, 400, "not a readable .npz"),
        (b"x" * 100, "text/plain", 415, "Content-Type text/plain is not served"),
        (b"{}", "application/x-www-form-urlencoded", 415, "add -H 'Content-Type: application/json'"),
    ],
)  # fmt: skip
def test_refusals_have_a_status_and_one_line(raw, content_type, status, message):
    with pytest.raises(RequestError) as error:
        decode_request(raw, content_type, SIGNATURE)
    assert error.value.status == status
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_error_text_is_repeated_whole_or_not_at_all():
    """JSON's message for an error far into a body is longer than the 80 characters it was cut to;
    an exception's text is repeated by its first line, whole, or left out."""
    with pytest.raises(RequestError) as error:
        decode_request(b"{" + b" " * 100_000 + b"x", None, SIGNATURE)
    assert str(error.value) == (
        "request body is not valid JSON (JSONDecodeError: Expecting property name enclosed in "
        "double quotes: line 1 column 100002 (char 100001))"
    )
    assert said_whole("first line\nsecond") == "first line"
    assert said_whole("x" * SAID_MAX) == "x" * SAID_MAX
    assert said_whole("x" * (SAID_MAX + 1)) is None and said_whole(" ") is None


def test_the_cli_message_for_a_wrong_shape():
    from aotc_runtime import InputMismatchError

    tensors = [torch.zeros(1, 3, dtype=torch.int64), torch.zeros(1, 1)]
    with pytest.raises(InputMismatchError) as cli:
        SIGNATURE.check_inputs(tensors)
    with pytest.raises(RequestError) as served:
        decode_request(body({"inputs": [[[0, 0, 0]], [[0.0]]]}), None, SIGNATURE)
    assert str(served.value) == str(cli.value)


def test_an_oversized_body_is_413_before_it_is_parsed():
    with pytest.raises(RequestError) as error:
        decode_request(b"{" * 2000, None, SIGNATURE, max_bytes=1000)
    assert error.value.status == 413 and "above this server's limit of 1000" in str(error.value)


def test_responses_name_the_outputs():
    out = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    raw, kind = encode_response(out, SIGNATURE, "application/json")
    assert kind == "application/json" and json.loads(raw) == {"outputs": {"out": out.tolist()}}
    raw, kind = encode_response(out.bfloat16(), SIGNATURE, NPZ_TYPE)
    with numpy.load(io.BytesIO(raw), allow_pickle=False) as archive:
        assert kind == NPZ_TYPE and archive["out"].tolist() == out.tolist()
    assert media_type(None) == "application/json"
