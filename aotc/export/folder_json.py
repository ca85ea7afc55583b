"""Reading the small files of a model or tokenizer folder (config.json, tokenizer_config.json, a
chat template), which come from whoever published the model: each is bounded in size before it
is read, and a JSON file must parse to an object, or the export stops in one line naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aotc.errors import UserInputError

# config.json, generation_config.json, tokenizer_config.json: kilobytes in practice (a config
# naming thousands of labels reaches a megabyte)
MAX_JSON_BYTES = 16 << 20


def read_bounded_text(path: Path, limit: int, fix: str) -> str:
    """The file's UTF-8 text; UserInputError if it is larger than `limit` bytes or not text."""
    size = path.stat().st_size
    if size > limit:
        raise UserInputError(
            f"{path} is {size} bytes, over the {limit >> 20} MiB aotc reads of such a file; {fix}"
        )
    with path.open("rb") as handle:
        data = handle.read(limit + 1)  # the file may have grown since stat()
    if len(data) > limit:
        raise UserInputError(
            f"{path} is over the {limit >> 20} MiB aotc reads of such a file; {fix}"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError(
            f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); {fix}"
        ) from None


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """A JSON object from `path`, bounded by MAX_JSON_BYTES."""
    text = read_bounded_text(path, MAX_JSON_BYTES, fix)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else "nested too deeply"
        raise UserInputError(f"{path} is not valid JSON ({reason}); {fix}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path} holds a JSON {type(data).__name__}, not an object; {fix}")
    return data
