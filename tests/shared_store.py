"""Folders made once per test run and shared by every test and every pytest-xdist worker that asks.

A package the tests need in several places (the demo MLP, a zoo LM's text-generation package) is
built by whichever worker asks first, under a file lock; the other worker waits for it and takes the
same folder. What decides the build names the folder (see `key`), so two tests asking for the same
build get the same package, and different builds never share one.

Shared packages are read-only: each folder's files are hashed when it is made, and `check_unchanged`
(run at the session's end) fails the run if a test changed one. A test that edits a package copies it
first (conftest.tampered_copy).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from filelock import FileLock


def worker() -> str | None:
    """This process's pytest-xdist worker id ("gw0", ...), or None in a run without workers."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def run_root(basetemp: Path) -> Path:
    """The folder every worker of this run shares: the run's base temp folder (each xdist worker's own
    is a child of it, popen-gwN)."""
    return basetemp.parent if worker() else basetemp


def key(*parts: object) -> str:
    """A short name for what decides a build: files by their bytes, everything else by its text."""
    digest = hashlib.sha256()
    for part in parts:
        data = (
            Path(part).read_bytes()
            if isinstance(part, Path) and part.is_file()
            else str(part).encode()
        )
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()[:16]


def once(folder: Path, make: Callable[[], None], outputs: Iterable[Path] = ()) -> None:
    """Run `make` unless another test or worker of this run already did, for `folder`.

    `make` writes `folder` and `outputs` (further files or folders beside it, such as the artifact
    a package is built from). A `make` that fails leaves nothing behind, so the next test to ask
    tries again and fails with its own message."""
    record = _record(folder)
    with FileLock(str(folder) + ".lock"):
        if record.exists():
            return
        for path in (folder, *outputs):
            _remove(path)
        try:
            make()
        except BaseException:
            for path in (folder, *outputs):
                _remove(path)
            raise
        record.write_text(json.dumps(_hashes(folder)))


def check_unchanged(root: Path) -> list[str]:
    """The shared folders under `root` whose files differ from when they were made, one line each."""
    changed = []
    for record in sorted(root.glob("*.made")):
        folder = record.with_name(record.name.removesuffix(".made"))
        if _hashes(folder) != json.loads(record.read_text()):
            changed.append(
                f"{folder.name}: a test changed this shared folder; copy it before editing"
            )
    return changed


def _record(folder: Path) -> Path:
    return folder.with_name(folder.name + ".made")


def _hashes(folder: Path) -> dict:
    if not folder.is_dir():
        return {}
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
