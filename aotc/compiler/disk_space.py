"""A full disk during a build: refused before compiling when the space is plainly not there, and
named (not "could not compile the model") when it runs out on the way.

A build writes to three places: the package folder (its staging copy beside it), Inductor's cache
(C++ sources, objects, the shared object) and the temporary folder. When torch's zip writer hits a
full disk its destructor throws again, from native code, and the process aborts (exit 134): the
error that reports such a failure asks the CLI to leave at once (DiskFullError.leave_at_once), before
that destructor runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from aotc.errors import DiskFullError

MARGIN_BYTES = 64 << 20  # sources, objects and the shared object of a model, beyond its weights
LOW_BYTES = 16 << 20  # a device with less than this free after a failure is why it failed


def build_locations(output: Path) -> list[tuple[str, Path]]:
    """(role, an existing folder) of every place a build writes to."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        cache = Path(cache_dir())
    except ImportError:  # an older layout: Inductor's cache lives under the temporary folder
        cache = Path(tempfile.gettempdir())
    places = [("the package folder", Path(output).resolve().parent), ("Inductor's cache", cache)]
    places.append(("the temporary folder", Path(tempfile.gettempdir())))
    return [(role, _existing(path)) for role, path in places]


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _free(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def check_space(output: Path, artifact: Path) -> None:
    """Refuse to start a build whose package plainly does not fit. The package folder and
    Inductor's cache each get a copy of the weights (about the artifact's size: AOTInductor writes
    them into its output before the package takes them), the temporary folder only sources; places
    on one device need their sum (an 8B model's build on one disk: twice its 16 GB), plus
    MARGIN_BYTES a device."""
    weights = os.path.getsize(artifact)
    devices: dict = {}  # device -> [roles, a folder on it, bytes needed there]
    for role, path in build_locations(output):
        needed = weights if role != "the temporary folder" else 0
        entry = devices.setdefault(_device(path), [[], path, MARGIN_BYTES])
        entry[0].append(role)
        entry[2] += needed
    for roles, path, needed in devices.values():
        free = _free(path)
        if free is not None and free < needed:
            raise DiskFullError(
                f"no space left on the device holding {path} ({', '.join(roles)}): {free >> 20} MiB "
                f"free, the build needs about {needed >> 20} MiB there; free space, or build "
                "elsewhere (-o for the package, TORCHINDUCTOR_CACHE_DIR for Inductor's cache, TMPDIR)"
            )


def _device(path: Path):
    """The filesystem `path` is on (its own path when that cannot be told)."""
    try:
        return os.stat(path).st_dev
    except OSError:
        return str(path)


def full_device(output: Path) -> str | None:
    """After a failed compile: the message for a device that ran out of space, if one did."""
    for role, path in build_locations(output):
        free = _free(path)
        if free is not None and free < LOW_BYTES:
            return (
                f"no space left on the device holding {path} ({role}, {free >> 20} MiB free) while "
                "compiling; free space, or build elsewhere (-o for the package, "
                "TORCHINDUCTOR_CACHE_DIR for Inductor's cache, TMPDIR)"
            )
    return None
