"""Reading the files of a model or tokenizer folder (config.json, tokenizer_config.json, a chat
template, the weights), which come from whoever published the model: each must be a regular file
of the folder, the small ones are bounded in size before they are read, and a JSON file must parse
to an object, or the export stops in one line naming it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from aotc.errors import UserInputError

# config.json, generation_config.json, tokenizer_config.json: kilobytes in practice (a config
# naming thousands of labels reaches a megabyte)
MAX_JSON_BYTES = 16 << 20


def folder_file(path: Path) -> Path:
    """`path` (a file of a model or tokenizer folder) resolved, once it is known to be a regular
    file inside its folder; UserInputError otherwise. A link out of the folder would put whatever
    it points at (/proc/self/environ, a private key) into the artifact and the package, and a FIFO
    or a device would block the export or never end. The one link taken is the Hugging Face hub
    cache's own layout: snapshots/<revision>/<file> pointing into the repository's blobs/."""
    folder = path.parent
    real = Path(os.path.realpath(path))
    allowed = [Path(os.path.realpath(folder))]
    if folder.parent.name == "snapshots":  # huggingface_hub's cache: ../../blobs/<hash>
        allowed.append(Path(os.path.realpath(folder.parent.parent / "blobs")))
    if not any(real.is_relative_to(root) for root in allowed):
        raise UserInputError(
            f"{path} is a link to {real}, outside {folder}; aotc reads only the folder's own "
            "files (a link could ship any file of this machine into the package): copy the file "
            "itself into the folder"
        )
    try:
        mode = os.stat(real).st_mode
    except OSError as exc:
        raise UserInputError(f"{path} cannot be read ({exc.strerror}); {_PUT_A_FILE}") from None
    if not stat.S_ISREG(mode):
        raise UserInputError(f"{path} is {_kind(mode)}, not a regular file; {_PUT_A_FILE}")
    return real


_PUT_A_FILE = "put the file itself there (what save_pretrained writes)"


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a device")


def open_folder_file(path: Path) -> BinaryIO:
    """The folder file at `path` open for reading (folder_file's checks). Opened without blocking
    and checked again once open: a regular file swapped for a FIFO after the check is refused,
    not waited on."""
    real = folder_file(path)
    descriptor = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise UserInputError(f"{path} is {_kind(mode)}, not a regular file; {_PUT_A_FILE}")
    return os.fdopen(descriptor, "rb")


def read_bounded_text(path: Path, limit: int, fix: str) -> str:
    """The file's UTF-8 text; UserInputError if it is not a regular file of its folder, is larger
    than `limit` bytes or is not text."""
    with open_folder_file(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise UserInputError(
                f"{path} is {size} bytes, over the {limit >> 20} MiB aotc reads of such a file; {fix}"
            )
        data = handle.read(limit + 1)  # the file may have grown since fstat()
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
