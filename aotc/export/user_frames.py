"""Find the user's own code in a traceback, so errors point at their file:line, not at torch."""

from __future__ import annotations

import linecache
import os
import traceback
from dataclasses import dataclass

_LIBRARY_MARKERS = (
    os.sep + "torch" + os.sep,
    os.sep + "site-packages" + os.sep,
    os.sep + "aotc" + os.sep,
    "<frozen ",
)


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    source: str

    def __str__(self) -> str:
        return (
            f"{self.file}:{self.line}: `{self.source}`"
            if self.source
            else f"{self.file}:{self.line}"
        )

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "source": self.source}


def location(file: str, line: int) -> Location:
    return Location(file, line, linecache.getline(file, line).strip())


def is_user_file(filename: str, user_files=()) -> bool:
    if user_files:
        return os.path.abspath(filename) in {os.path.abspath(f) for f in user_files}
    return not any(marker in filename for marker in _LIBRARY_MARKERS)


def innermost_user_frame(exc: BaseException, user_files=()) -> Location | None:
    """The deepest frame of the exception's traceback that lies in the user's files."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if is_user_file(frame.filename, user_files):
            found = location(frame.filename, frame.lineno)
    return found


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
