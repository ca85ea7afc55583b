"""Why a sequence ended (runtime/aotc_runtime/finish_reason.py): OpenAI's strings wherever it is
written, a str() or format() on any Python from 3.10 and json.dumps in an answer or a chunk
alike."""

from __future__ import annotations

import json

import pytest

from aotc_runtime.finish_reason import FinishReason


def test_the_reasons_are_openais_and_the_engines_error():
    assert [reason.value for reason in FinishReason] == ["stop", "length", "error"]
    assert FinishReason("stop") is FinishReason.STOP  # read back from its string


@pytest.mark.parametrize("reason", list(FinishReason), ids=lambda reason: reason.value)
def test_a_reason_is_written_as_its_plain_string(reason):
    value = reason.value
    assert reason == value and isinstance(reason, str)
    assert str(reason) == f"{reason}" == format(reason, "") == value
    assert f"{reason:>8}" == f"{value:>8}"
    assert json.dumps(reason) == f'"{value}"'
    body = {"choices": [{"index": 0, "finish_reason": reason}]}
    for options in ({}, {"separators": (",", ":")}, {"indent": 1}):  # each encoder json has
        written = json.dumps(body, **options)
        assert f'"{value}"' in written and "FinishReason" not in written
        assert json.loads(written)["choices"][0]["finish_reason"] == value
