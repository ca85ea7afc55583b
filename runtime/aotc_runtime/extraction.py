"""Where torch unpacks a package's model.pt2, and that it does not outlive the process.

AOTInductor's package loader extracts the archive (the model's .so and weights) into a fresh
`aotinductor_*` folder under the temporary directory and removes it in its destructor. A process
that never runs the destructor (killed by a signal, a Ray replica stopped, a loader kept alive by
a traceback until exit) leaves a copy of the model behind, one per load. So each process gives the
loader a private parent folder, `aotc-runtime-<pid>-*` (0700), removed at exit; and a load removes
the folders of processes that are gone (what a SIGKILL or a power cut left).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

PREFIX = "aotc-runtime-"
_lock = threading.Lock()
_folder: Path | None = None
_folder_pid = 0  # a forked child makes its own: its parent's folder is not its to remove


@contextlib.contextmanager
def private_extraction() -> Iterator[Path]:
    """While open, torch's loader extracts under this process's private folder (TMPDIR points
    there: std::filesystem::temp_directory_path reads it at each call). Loads hold a lock, so two
    threads loading at once do not see each other's TMPDIR."""
    with _lock:
        folder = _process_folder()
        before = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(folder)
        try:
            yield folder
        finally:
            if before is None:
                del os.environ["TMPDIR"]
            else:
                os.environ["TMPDIR"] = before


def _process_folder() -> Path:
    global _folder, _folder_pid
    if _folder is None or _folder_pid != os.getpid() or not _folder.is_dir():
        root = Path(tempfile.gettempdir())
        remove_orphans(root)
        _folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
        _folder_pid = os.getpid()
        atexit.register(_remove_at_exit, _folder, _folder_pid)
    return _folder


def _remove_at_exit(folder: Path, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)


def remove_orphans(root: Path) -> list[Path]:
    """Remove this user's extraction folders whose process is gone; return them."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            pid = _owner_pid(entry)
            if pid is None or _alive(pid):
                continue
            try:
                info = entry.lstat()
            except OSError:
                continue
            # Only real folders of this user: never follow a link planted in a shared /tmp.
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def _owner_pid(entry: Path) -> int | None:
    if not entry.name.startswith(PREFIX):
        return None
    digits = entry.name[len(PREFIX) :].split("-", 1)[0]
    return int(digits) if digits.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process has that pid: not ours to judge
        return True
    return True
