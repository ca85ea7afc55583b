"""Write a package folder atomically: build in a temporary folder beside the target, rename at the end.

A failed, crashed or interrupted build removes its temporary folder, so nothing that looks like a
package is ever left behind; an existing target is replaced only with --force, and only once the new
package is complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path

from aotc_runtime import (
    MANIFEST_NAME,
    Manifest,
    hash_package_files,
    manifest_text,
    write_text_atomically,
)

VERIFY_PREFIX = (
    "aotc-verify-"  # + PID + "-": the numeric check's work folders in the temp directory
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to clean
        return True
    return True


def remove_stale(target: Path) -> list:
    """Remove what builds killed outright (SIGKILL, a lost machine) left behind: temporary package
    folders beside `target` and numeric-check folders in the temp directory, of processes that are
    gone. A live build's folders are never touched. Returns what was removed."""
    target = Path(target)
    removed = []
    own = re.compile(rf"^\.{re.escape(target.name)}\.aotc-(?:tmp|old)-(\d+)$")
    candidates = [(p, own.match(p.name)) for p in target.parent.glob(f".{target.name}.aotc-*")]
    verify = re.compile(rf"^{VERIFY_PREFIX}(\d+)-")
    candidates += [
        (p, verify.match(p.name)) for p in Path(tempfile.gettempdir()).glob(f"{VERIFY_PREFIX}*")
    ]
    for path, match in candidates:
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextlib.contextmanager
def output_lock(target: Path):
    """Hold `target` for one build: a second build into the same folder at once is refused, not
    allowed to replace the first's package. The lock (flock on a file beside the target) goes with
    the process, however it ends."""
    from aotc.errors import UserInputError

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    path = target.parent / f".{target.name}.aotc-lock"
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserInputError(
                f"another aotc build is writing {target} right now; wait for it to finish or choose another -o"
            ) from None
        # The holder before us removes the file as it lets go: make sure ours is still the one at `path`.
        if path.exists() and os.stat(path).st_ino == os.fstat(fd).st_ino:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


@contextlib.contextmanager
def staging_folder(target: Path):
    """Yield a fresh temporary folder beside `target`; removed unless `commit()` moved it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    staging = target.parent / f".{target.name}.aotc-tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_manifest(folder: Path, manifest: Manifest, hash_files: bool = True) -> Manifest:
    """Hash every file in the folder into the manifest's `files` and write manifest.json.
    hash_files=False keeps `files` as it is: for a record added after the last hashing, when no
    other file has changed since (hashing reads the whole package again)."""
    if hash_files:
        manifest = dataclasses.replace(manifest, files=hash_package_files(folder))
    write_text_atomically(folder / MANIFEST_NAME, manifest_text(manifest))
    return manifest


def commit(staging: Path, target: Path) -> None:
    """Move the finished package into place, replacing an old one only now that the new one is whole."""
    target = Path(target)
    if target.exists():
        old = target.parent / f".{target.name}.aotc-old-{os.getpid()}"
        target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    else:
        staging.rename(target)


def write_tokenizer(artifact: Path, generation, staging: Path) -> None:
    """The tokenizer and chat template a text-generation artifact carries, into the package under
    the names its manifest gives (then hashed with the rest, so signing covers them): every
    backend's package keeps them."""
    from aotc.errors import UserInputError
    from aotc.export.artifact import read_artifact_chat_template, read_artifact_tokenizer

    if generation is None:
        return
    carried = (
        ("tokenizer", generation.tokenizer, read_artifact_tokenizer),
        ("chat template", generation.chat_template, read_artifact_chat_template),
    )
    for what, name, read in carried:
        if not name:
            continue
        text = read(artifact)
        if text is None:
            raise UserInputError(
                f"{artifact} says it carries a {what} but holds none; re-export it"
            )
        (staging / name).write_text(text, encoding="utf-8")
