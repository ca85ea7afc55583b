"""Files that appear whole or not at all: write to a temporary name beside the target, then rename.

A reader (another process, a later run) never sees half a file, and a failure or an interrupt
leaves the old file as it was. aotc uses the same function for artifacts, manifests and reports.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path`; once the block succeeds it replaces `path` in one rename.

    `suffix`: the temporary file's suffix, for writers that insist on one (torch.export.save wants
    `.pt2`, matplotlib picks the format from it); default: the target's.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(
        f".{path.stem}.{os.getpid()}.tmp{path.suffix if suffix is None else suffix}"
    )
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text_atomically(path: str | os.PathLike, text: str, mode: int | None = None) -> None:
    with replaced_atomically(path) as tmp:
        tmp.write_text(text)
        if mode is not None:
            tmp.chmod(mode)
