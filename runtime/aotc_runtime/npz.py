"""Reading .npy and .npz inputs without trusting them: what a file declares (entry count, names,
each array's shape and dtype, their bytes) is checked against the package's signature before any
array data is decompressed or allocated. `aotc run --input` (tensor_io.read_inputs) and
`aotc serve` (runtime/aotc_runtime/serve/protocol.py) read through here; the C++ runner follows the
same rules.

An .npz, in this order:
1. Its end-of-central-directory record (in the last 22 bytes + 64 KiB) is read first: one disk,
   no zip64, nothing after its comment, its central directory ending where it begins, at most
   MAX_DIRECTORY_ENTRY bytes of directory per entry, and no more entries than inputs left to fill.
   A 40,000-entry archive is refused before zipfile parses its directory.
2. Every entry is `NAME.npy`, none twice. The names are the inputs left to fill (any order), or
   arr_0 ... arr_{k-1} (numpy.savez's names for arrays given by position), filling those inputs in
   order. The last (or only) file must fill every input left; anything else is refused naming the
   inputs expected. An archive is never read in archive order under other names.
3. Each entry is stored or deflated, not encrypted; its .npy header (format 1.0, 2.0, or 3.0 with an
   ASCII header; at most 64 KiB) is read through a bounded read and parsed by numpy's own header
   reader (literals only, nothing runs). Its dtype is a plain bool/int/uint/float in native byte
   order, and dtype and shape pass Signature.check_declared (the messages `aotc run` gives for a
   tensor). Its size in the directory is the header plus exactly the bytes that shape and dtype take.
4. The declared data bytes of all entries are at most `max_bytes` (serve: its body limit):
   InputTooLargeError (HTTP 413).
5. Only then is each entry read, exactly its declared bytes, into one array allocated for it; a
   short stream or a CRC mismatch is refused. Peak memory is the declared bytes plus one chunk.

An .npy file: steps 3 and 5, its file size being the header plus the declared bytes exactly.
A damaged file of either kind is an InputMismatchError naming it, never another exception.
"""

from __future__ import annotations

import io
import math
import os
import struct
import tokenize
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from .errors import InputMismatchError, InputTooLargeError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from .signature import Signature

HEADER_LIMIT = 64 << 10  # the C++ runner's bound too; numpy.save writes about 128 bytes
CHUNK = 1 << 20  # bytes read at a time into an array
EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory: signature ... comment length
EOCD_SIGNATURE = b"PK\x05\x06"
ZIP64_LOCATOR = b"PK\x06\x07"  # the 20-byte record before the end record of a zip64 archive
MAX_COMMENT = 0xFFFF
# A directory entry is 46 bytes plus its name, extra fields and comment. numpy.savez writes names
# of input-name length and no extras; 4 KiB leaves room for other writers' timestamps. Without
# this bound a directory claiming one entry could hold thousands for zipfile to parse.
MAX_DIRECTORY_ENTRY = 46 + 4096
READABLE = "float16/32/64, int8/16/32/64, uint8 or bool"
# What numpy, zipfile and zlib raise on a damaged file (struct.error: short records; OSError: a
# seek before the start; RecursionError/MemoryError: a header nested past the parser's depth;
# TokenError: numpy's fallback reader of Python 2 headers on an unterminated one).
DAMAGED = (
    tokenize.TokenError,
    zipfile.BadZipFile,
    zlib.error,
    struct.error,
    ValueError,
    EOFError,
    OverflowError,
    NotImplementedError,
    RecursionError,
    SyntaxError,
    MemoryError,
    OSError,
)


@dataclass(frozen=True)
class NpyHeader:
    shape: tuple
    dtype: Any  # numpy.dtype
    fortran_order: bool
    length: int  # bytes before the data: magic, version, header length and header

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def read_npy(stream: IO[bytes], signature: Signature, index: int, bound: dict) -> Any:
    """Input `index` from an .npy file (an open binary file), its header checked against the
    signature before the data is allocated: a header claiming 10**12 elements is refused."""
    where = f"input file {getattr(stream, 'name', 'stream')}"
    with _damage_refused(where, ".npy"):
        header = read_npy_header(stream, where)
        check_header(header, where, signature, index, bound)
        size = os.fstat(stream.fileno()).st_size
        if size != header.length + header.nbytes:
            raise InputMismatchError(
                f"{where} holds {size - header.length} bytes of data but its header declares "
                f"{header.nbytes}; save it again with numpy.save"
            )
        return read_npy_data(stream, header, where)


def read_npz(
    stream: IO[bytes],
    signature: Signature,
    label: str,
    *,
    inputs: Sequence[int] | None = None,
    complete: bool = True,
    max_bytes: int | None = None,
    bound: dict | None = None,
) -> dict[int, Any]:
    """The arrays of an .npz (a seekable binary stream), by the index of the input each fills.

    `label` names the archive in errors ("input file x.npz", "request body"). `inputs`: the
    indices it may fill (default all); `complete`: it must fill all of them; `max_bytes`: bound on
    the declared bytes (InputTooLargeError); `bound`: dim sizes set by earlier files.
    """
    inputs = list(range(len(signature.inputs))) if inputs is None else list(inputs)
    bound = {} if bound is None else bound
    with _damage_refused(label, ".npz"):
        count = _entry_count(stream, label, signature, inputs)
        with zipfile.ZipFile(stream) as archive:
            entries = archive.infolist()
            if len(entries) != count:
                raise InputMismatchError(
                    f"{label} lists {len(entries)} entries in its zip directory but {count} in its "
                    "end record; save it again with numpy.savez"
                )
            targets = _targets(entries, signature, inputs, complete, label)
            where = [f"{label} entry {_shown(info.filename)}" for info in entries]
            headers = [
                _entry_header(archive, info, place, signature, index, bound)
                for info, place, index in zip(entries, where, targets)
            ]
            total = sum(header.nbytes for header in headers)
            if max_bytes is not None and total > max_bytes:
                raise InputTooLargeError(
                    f"{label} unpacks to {total} bytes of arrays, above the limit of {max_bytes}",
                    total,
                    max_bytes,
                )
            arrays = {}
            for info, place, index, header in zip(entries, where, targets, headers):
                with archive.open(info) as entry:
                    entry.read(header.length)  # read and checked above
                    arrays[index] = read_npy_data(entry, header, place)
            return arrays


def read_npy_header(stream: IO[bytes], where: str) -> NpyHeader:
    """The header at the stream's position, read with bounded reads and parsed by numpy."""
    from numpy.lib import format as npy_format

    start = _read_exactly(stream, 8, where)
    if start[:6] != b"\x93NUMPY":
        raise InputMismatchError(
            f"{where} is not a .npy array (no \\x93NUMPY magic); save it with numpy.save"
        )
    major, minor = start[6], start[7]
    if major not in (1, 2, 3) or minor != 0:
        raise InputMismatchError(
            f"{where} has .npy format version {major}.{minor}; versions 1.0 to 3.0 are read"
        )
    length_field = _read_exactly(stream, 2 if major == 1 else 4, where)
    length = int.from_bytes(length_field, "little")
    if length > HEADER_LIMIT:
        raise InputMismatchError(
            f"{where} has a .npy header of {length} bytes, above {HEADER_LIMIT}; save it with numpy.save"
        )
    text = _read_exactly(stream, length, where)
    # Format 3.0 differs from 2.0 only in a UTF-8 header, which only structured dtypes (refused
    # below) need: an ASCII one reads as 2.0, with numpy's public reader.
    if major == 3 and not text.isascii():
        raise InputMismatchError(
            f"{where} has a non-ASCII .npy header (a structured dtype); use {READABLE} arrays"
        )
    reader = npy_format.read_array_header_1_0 if major == 1 else npy_format.read_array_header_2_0
    shape, fortran_order, dtype = reader(
        io.BytesIO(length_field + text), max_header_size=HEADER_LIMIT
    )
    return NpyHeader(tuple(shape), dtype, fortran_order, len(start) + len(length_field) + length)


def check_header(
    header: NpyHeader, where: str, signature: Signature, index: int, bound: dict
) -> None:
    """A plain array of the input's dtype and a shape its signature accepts."""
    dtype = header.dtype
    if any(type(size) is not int or size < 0 for size in header.shape):
        raise InputMismatchError(
            f"{where} declares shape {_shown(str(header.shape))}, which is not a tuple of sizes; "
            "save it with numpy.save"
        )
    if dtype.hasobject or dtype.names is not None or dtype.subdtype is not None:
        raise InputMismatchError(
            f"{where} has dtype {_shown(str(dtype))}: not a plain array; use {READABLE} arrays"
        )
    if dtype.kind not in "biuf":
        raise InputMismatchError(f"{where} has dtype '{dtype.str}': use {READABLE} arrays")
    if not dtype.isnative:
        raise InputMismatchError(
            f"{where} has dtype '{dtype.str}': big-endian data; save it little-endian "
            "(arr.astype(arr.dtype.newbyteorder('<')))"
        )
    signature.check_declared(index, list(header.shape), dtype.name, bound)


def read_npy_data(stream: IO[bytes], header: NpyHeader, where: str) -> Any:
    """Exactly the header's bytes, read chunk by chunk into one array allocated for them (not
    joined into a bytes object first: peak memory is the array plus one chunk)."""
    import numpy

    try:
        array = numpy.empty(header.shape, header.dtype, order="F" if header.fortran_order else "C")
    except MemoryError:
        raise InputMismatchError(
            f"{where} declares {header.nbytes} bytes of data, more than this machine can allocate"
        ) from None
    # the array's memory as bytes, in file order (order="A": memory order, a view of `array`)
    raw = array.reshape(-1, order="A").view(numpy.uint8)
    filled = 0
    while filled < len(raw):
        chunk = stream.read(min(CHUNK, len(raw) - filled))
        if not chunk:
            raise InputMismatchError(
                f"{where} is truncated: its header declares {header.nbytes} bytes of data, it "
                f"holds {filled}; save it again"
            )
        raw[filled : filled + len(chunk)] = numpy.frombuffer(chunk, numpy.uint8)
        filled += len(chunk)
    if stream.read(1):  # also where zipfile compares the entry's CRC-32, at its end
        raise InputMismatchError(
            f"{where} holds more data than its header declares ({header.nbytes} bytes); save it again"
        )
    return array


def match_names(
    names: Sequence[str], signature: Signature, inputs: Sequence[int], complete: bool
) -> list | None:
    """The input each name fills: names of inputs among `inputs` (all of them when `complete`),
    or arr_0, arr_1, ... filling `inputs` in order; None when the names are neither."""
    open_names = [signature.inputs[i].name for i in inputs]
    if set(names) <= set(open_names) and (not complete or set(names) == set(open_names)):
        return [inputs[open_names.index(name)] for name in names]
    positional = {f"arr_{i}": i for i in range(len(inputs) if complete else len(names))}
    if len(names) <= len(inputs) and set(names) == set(positional):
        return [inputs[positional[name]] for name in names]
    return None


def expected_inputs(signature: Signature, inputs: Sequence[int]) -> str:
    """'the package takes inputs a, b', or which are left when earlier files gave some."""
    names = ", ".join(signature.inputs[i].name for i in inputs)
    if len(inputs) == len(signature.inputs):
        return f"the package takes input(s) {names}"
    return f"the inputs left after the earlier --input files are {names or 'none'}"


def _entry_count(stream: IO[bytes], label: str, signature: Signature, inputs: list) -> int:
    """The entry count of the archive's end record, checked before zipfile parses the directory."""
    size = stream.seek(0, io.SEEK_END)
    tail_start = max(0, size - EOCD.size - MAX_COMMENT)
    stream.seek(tail_start)
    tail = stream.read(size - tail_start)
    # the last signature with a whole record after its first byte
    at = tail.rfind(EOCD_SIGNATURE, 0, max(0, len(tail) - EOCD.size + len(EOCD_SIGNATURE)))
    if at < 0:
        raise InputMismatchError(
            f"{label} is not a readable .npz (no zip end record); save it with numpy.savez"
        )
    _, disk, directory_disk, on_disk, count, directory_size, directory_at, comment = (
        EOCD.unpack_from(tail, at)
    )
    end_record = tail_start + at
    fix = "save it with numpy.savez"
    if at + EOCD.size + comment != len(tail):
        raise InputMismatchError(f"{label} has bytes after its zip end record; {fix}")
    if end_record >= 20:
        stream.seek(end_record - 20)
        zip64 = stream.read(4) == ZIP64_LOCATOR
    else:
        zip64 = False
    if zip64 or 0xFFFF in (count, on_disk) or 0xFFFFFFFF in (directory_size, directory_at):
        raise InputMismatchError(
            f"{label} is a zip64 archive (over 4 GiB or 65,535 entries), which is not read; "
            "send smaller inputs"
        )
    if disk or directory_disk or on_disk != count:
        raise InputMismatchError(f"{label} is a multi-disk zip archive; {fix}")
    if count > len(inputs):
        raise InputMismatchError(
            f"{label} holds {count} entries; {expected_inputs(signature, inputs)}: save one array "
            "per input"
        )
    if directory_at + directory_size != end_record:
        raise InputMismatchError(
            f"{label} has its zip directory where its end record does not place it; {fix}"
        )
    if directory_size > count * MAX_DIRECTORY_ENTRY:
        raise InputMismatchError(
            f"{label} has a zip directory of {directory_size} bytes for {count} entries; {fix}"
        )
    return count


def _targets(entries: list, signature: Signature, inputs: list, complete: bool, label: str) -> list:
    """The input each entry fills, by the entries' names (rule 2 of the module docstring)."""
    names = []
    for info in entries:
        if not info.filename.endswith(".npy"):
            raise InputMismatchError(
                f"{label} holds entry {_shown(info.filename)}, not an .npy array; save arrays "
                "with numpy.savez"
            )
        name = info.filename[: -len(".npy")]
        if name in names:
            raise InputMismatchError(
                f"{label} holds entry {_shown(info.filename)} twice; save each input once"
            )
        names.append(name)
    targets = match_names(names, signature, inputs, complete)
    if targets is None:
        wanted = [signature.inputs[i].name for i in inputs]
        example = ", ".join(f"{name}=..." for name in wanted)
        positional = ", ".join(f"arr_{i}" for i in range(len(wanted)))
        raise InputMismatchError(
            f"{label} holds entries {', '.join(map(_shown, names)) or 'none'}; "
            f"{expected_inputs(signature, inputs)}: name each entry after its input "
            f"(numpy.savez(path, {example})), or save them in order as {positional}"
        )
    return targets


def _entry_header(
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    where: str,
    signature: Signature,
    index: int,
    bound: dict,
) -> NpyHeader:
    if info.flag_bits & 0x1:
        raise InputMismatchError(f"{where} is encrypted; save it with numpy.savez")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise InputMismatchError(
            f"{where} is compressed with zip method {info.compress_type}; save it with "
            "numpy.savez or numpy.savez_compressed"
        )
    with archive.open(info) as entry:
        # zipfile inflates at most what is asked (and 4 KiB): a bomb is not unpacked here
        header = read_npy_header(entry, where)
    check_header(header, where, signature, index, bound)
    if info.file_size != header.length + header.nbytes:
        raise InputMismatchError(
            f"{where} is {info.file_size} bytes unpacked but its .npy header describes "
            f"{header.length + header.nbytes}; save it again with numpy.savez"
        )
    return header


def _read_exactly(stream: IO[bytes], size: int, where: str) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise InputMismatchError(f"{where} is truncated in its .npy header; save it again")
    return data


@contextmanager
def _damage_refused(where: str, kind: str) -> Iterator[None]:
    """What numpy, zipfile or zlib raise on a damaged file, as one InputMismatchError line."""
    try:
        yield
    except InputMismatchError:
        raise
    except DAMAGED as exc:
        saver = "numpy.savez" if kind == ".npz" else "numpy.save"
        raise InputMismatchError(
            f"{where} is not a readable {kind} ({type(exc).__name__}: {_shown(str(exc), 80)}); "
            f"save it with {saver}"
        ) from None


def _shown(text: str, limit: int = 40) -> str:
    """Text from a file, shortened and on one line (a name may hold a line break)."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_npz(target: Any, arrays: dict[str, Any]) -> None:
    """The named numpy arrays as an .npz (what numpy.load reads) written to the binary file
    object `target`: an entry NAME.npy per array, stored uncompressed, no pickles. Not
    numpy.savez(target, **arrays): it takes an array named `file` or `allow_pickle` for its own
    parameter (a TypeError, or the array silently left out), and signatures name tensors freely."""
    import numpy

    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
                numpy.lib.format.write_array(entry, numpy.asanyarray(array), allow_pickle=False)
