"""Make model.pt2 depend only on what was compiled, so the same artifact, options and toolchain give
the same bytes.

Two things in AOTInductor's archive change from build to build though the compiled model does not:
- Inductor appends the compile and link commands to the C++ sources it keeps in its cache, and the
  archive copies those sources: each rebuild from a warm cache adds one more block of comments.
  Only the last block (the commands of this build) is kept.
- torch's zip writer stores a random `.data/serialization_id`. It becomes a digest of the other
  entries, so it still tells different archives apart.
The archive is rewritten with its entries in the same order, uncompressed as torch writes them, each
one's data aligned to 64 bytes as torch's writer aligns it (readers may map tensors in place).
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
from pathlib import Path

from aotc_runtime import replaced_atomically

COMMANDS_MARKER = "\n// Compile cmd\n"
SERIALIZATION_ID = ".data/serialization_id"
ALIGNMENT = 64
_PADDING_TAG = b"FB"  # the extra-field id torch's writer pads with
_LOCAL_HEADER = 30  # bytes of a zip local file header before its name and extra field


def last_commands_only(source: str) -> str:
    """The source with only the last of the compile/link command blocks appended to it."""
    first = source.find(COMMANDS_MARKER)
    if first < 0:
        return source
    last = source.rfind(COMMANDS_MARKER)
    return source[:first] + source[last:]


def normalize_archive(path: Path, without_suffixes: tuple = ()) -> None:
    """Rewrite the AOTInductor archive at `path` in place (atomically) as described above, leaving
    out the entries whose names end with one of `without_suffixes`."""
    with zipfile.ZipFile(path) as archive:
        entries = [
            (info, archive.read(info))
            for info in archive.infolist()
            if not info.filename.endswith(tuple(without_suffixes))
        ]
    cleaned = []
    for info, data in entries:
        if info.filename.endswith(".cpp"):
            data = last_commands_only(data.decode("utf-8", "surrogateescape")).encode(
                "utf-8", "surrogateescape"
            )
        cleaned.append((info, data))
    digest = hashlib.sha256()
    for info, data in cleaned:
        if not info.filename.endswith(SERIALIZATION_ID):
            digest.update(info.filename.encode() + b"\0" + data)
    serialization_id = str(int(digest.hexdigest(), 16))[:40].encode()
    with replaced_atomically(path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as out:
        for info, data in cleaned:
            if info.filename.endswith(SERIALIZATION_ID):
                data = serialization_id
            entry = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            entry.compress_type = zipfile.ZIP_STORED
            entry.external_attr = info.external_attr
            entry.extra = _alignment_padding(out.fp.tell(), entry.filename)
            out.writestr(entry, data)


def _alignment_padding(offset: int, name: str) -> bytes:
    """An extra field that puts the entry's data (after its local header) on a 64-byte boundary."""
    header_end = offset + _LOCAL_HEADER + len(name.encode()) + 4  # +4: the extra field's own header
    pad = (-header_end) % ALIGNMENT
    return _PADDING_TAG + struct.pack("<H", pad) + b"Z" * pad
