"""aotc's cache folder: $AOTC_CACHE_DIR, else $XDG_CACHE_HOME/aotc, else ~/.cache/aotc.

It holds what builds reuse (tuned and specialized builds, aotc/tune/cache.py; the CPU vector-ISA
probe's answer, aotc/compiler/cpu_isa.py). Whoever can write it can change what a build produces,
so it is created private (0700) and refused when another user owns it or others can write it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from aotc.errors import UserInputError


def cache_root() -> Path:
    explicit = os.environ.get("AOTC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aotc"


def private_cache_root() -> Path:
    """cache_root(), created 0700 if missing; refused (exit 2) when it is not this user's alone."""
    root = cache_root()
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = root.stat()  # a link to a cache elsewhere is judged by its target
    except OSError as exc:
        raise UserInputError(
            f"build cache {root} cannot be created ({exc.strerror}); set AOTC_CACHE_DIR to a "
            "folder of your own"
        ) from None
    problem = cache_trust_problem(info)
    if problem:
        raise UserInputError(
            f"build cache {root} {problem}: whoever can write it can change what your builds "
            f"produce; {_trust_fix(root, problem)}"
        )
    return root


def cache_trust_problem(info: os.stat_result) -> str | None:
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.getuid():
        return f"is owned by user id {info.st_uid}, not by you ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _trust_fix(root: Path, problem: str) -> str:
    if problem.startswith("is writable"):
        return f"run `chmod 700 {root}` or set AOTC_CACHE_DIR to a private folder"
    return "set AOTC_CACHE_DIR to a folder of your own (it is created private)"
