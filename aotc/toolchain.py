"""The C++ compiler Inductor uses for the model .so, and the link flag aotc adds to it.

Why -Wl,-Bsymbolic: the model .so carries its own copies of C++ standard-library template code
(std::regex and friends, from the system g++ headers). Without -Bsymbolic the dynamic linker binds
those names to copies already exported by the torch libraries in the process, which may come from
another toolchain; on the GPU machine (torch 2.11 + g++ 13.3) that mix crashes inside
`parse_device_str`'s std::regex on load (shared/GPU-NOTES.md). With -Bsymbolic the .so binds to its
own copies. On machines where the copies already agree it changes nothing observable.

How: Inductor takes the compiler from `torch._inductor.config.cpp.cxx` (its name must contain g++
or gcc). aotc points it at a tiny wrapper that appends the flag only to the command that links the
shared object (`-shared`): adding it to every command breaks Inductor's precompiled-header step.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import BuildError

LINK_FLAG = "-Wl,-Bsymbolic"

_WRAPPER = """#!/bin/sh
# Written by aotc (aotc/toolchain.py): link shared objects with {flag}, compile everything else as is.
for arg in "$@"; do
  if [ "$arg" = "-shared" ]; then exec "{real}" "$@" {flag}; fi
done
exec "{real}" "$@"
"""


def real_compiler() -> str:
    """The g++ Inductor would use without aotc: $CXX, else g++ on PATH."""
    name = os.environ.get("CXX") or "g++"
    path = shutil.which(name)
    if path is None:
        raise BuildError(f"C++ compiler '{name}' not found; install g++ or set CXX to a g++/gcc binary")
    return path


def compiler_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0].strip() if out else "unknown"


def bsymbolic_wrapper(real: str) -> Path:
    """Path of the wrapper for `real`, written once per compiler and user.

    It lives at a stable path so Inductor's caches (keyed on the compiler setting) stay warm
    across builds; it is rewritten atomically if its content ever differs.
    """
    content = _WRAPPER.format(real=real, flag=LINK_FLAG)
    tag = hashlib.sha256(content.encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"aotc-toolchain-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"aotc-{tag}-g++"  # Inductor recognises the compiler family by "g++" in the name
    if not path.is_file() or path.read_text() != content:
        tmp = folder / f".{path.name}.{os.getpid()}"
        tmp.write_text(content)
        tmp.chmod(0o755)
        tmp.replace(path)
    return path


def compiler_options(bsymbolic: bool) -> tuple[dict, dict]:
    """(Inductor options that select the compiler, what the manifest records about it)."""
    real = real_compiler()
    record = {"cxx": real, "cxx_version": compiler_version(real), "link_flags": [LINK_FLAG] if bsymbolic else []}
    if not bsymbolic:
        return {"cpp.cxx": (None, real)}, record
    return {"cpp.cxx": (None, str(bsymbolic_wrapper(real)))}, record
