"""The C++ compiler Inductor uses for the model .so, and the link flag aotc adds to it.

Why -Wl,-Bsymbolic: the model .so carries its own copies of C++ standard-library template code
(std::regex and friends, from the system g++ headers). Without -Bsymbolic the dynamic linker binds
those names to copies already exported by the torch libraries in the process, which may come from
another toolchain; on the GPU machine (torch 2.11 + g++ 13.3) that mix crashes inside
`parse_device_str`'s std::regex on load (shared/GPU-NOTES.md). With -Bsymbolic the .so binds to its
own copies. On machines where the copies already agree it changes nothing observable.

Which g++: the one whose libstdc++ is the libstdc++ this process (and so a serving process)
has loaded. A g++ from another GCC release compiles the .so against headers whose inline code and
symbol versions do not match the libstdc++ present at load time; on the GPU machine $CXX points to
such a compiler (/opt/gcc) and its packages crash on load even with -Bsymbolic, while the system
g++ (whose libstdc++ torch loads) gives packages that load and run. $CXX and g++ on PATH are asked
in that order, the first match wins; AOTC_CXX forces a compiler without the check.

How: Inductor takes the compiler from `torch._inductor.config.cpp.cxx` (its name must contain g++
or gcc). aotc points it at a tiny wrapper that appends the flag only to the command that links the
shared object (`-shared`): adding it to every command breaks Inductor's precompiled-header step.
"""

from __future__ import annotations

import contextlib
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


def loaded_libstdcxx() -> str | None:
    """Real path of the libstdc++ mapped into this process once torch is imported (Linux only)."""
    import torch  # noqa: F401  (torch's libraries pull in the libstdc++ a serving process will use)

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split()
        if fields and "/libstdc++.so" in fields[-1]:
            return os.path.realpath(fields[-1])
    return None


def compiler_libstdcxx(cxx: str) -> str | None:
    """Real path of the libstdc++ that `cxx` links against, or None if it cannot say."""
    try:
        out = subprocess.run([cxx, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return os.path.realpath(out) if os.path.isabs(out) and os.path.exists(out) else None


def candidate_compilers() -> list[str]:
    """$CXX, then g++ on PATH, then /usr/bin/g++: existing ones, each real binary once."""
    found, seen = [], set()
    for name in (os.environ.get("CXX"), "g++", "/usr/bin/g++"):
        path = shutil.which(name) if name else None
        if path and os.path.realpath(path) not in seen:
            seen.add(os.path.realpath(path))
            found.append(path)
    return found


def choose_compiler() -> tuple[str, dict]:
    """(compiler path, what the manifest records about the choice)."""
    forced = os.environ.get("AOTC_CXX")
    if forced:
        path = shutil.which(forced)
        if path is None:
            raise BuildError(f"AOTC_CXX={forced} is not an executable; point it at a g++ binary or unset it")
        return path, {"cxx_choice": "AOTC_CXX"}
    candidates = candidate_compilers()
    if not candidates:
        raise BuildError("no C++ compiler found: install g++ (or set CXX / AOTC_CXX to a g++ binary)")
    loaded = loaded_libstdcxx()
    for path in candidates:
        if loaded and compiler_libstdcxx(path) == loaded:
            return path, {"cxx_choice": "libstdc++ matches the one torch loads", "libstdcxx": loaded}
    return candidates[0], {"cxx_choice": "first available (no g++ matches the libstdc++ torch loads)", "libstdcxx": loaded}


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
    real, choice = choose_compiler()
    record = {"cxx": real, "cxx_version": compiler_version(real), "link_flags": [LINK_FLAG] if bsymbolic else [], **choice}
    cxx = str(bsymbolic_wrapper(real)) if bsymbolic else real
    return {"cpp.cxx": (None, cxx)}, record


@contextlib.contextmanager
def use_compiler(cxx: str):
    """Name the compiler in $CXX (and Inductor's config) for this build and every process it starts.

    Inductor compiles some C++ in worker processes that read their compiler from $CXX when they
    import torch._inductor.config; a config patch in this process does not reach them, and a mix
    of compilers in one .so is exactly what must not happen. Both are restored afterwards.
    """
    import sys

    old_env = os.environ.get("CXX")
    config = sys.modules.get("torch._inductor.config")
    old_config = config.cpp.cxx if config is not None else None
    os.environ["CXX"] = cxx
    if config is not None:
        config.cpp.cxx = (None, cxx)
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop("CXX", None)
        else:
            os.environ["CXX"] = old_env
        if config is not None:
            config.cpp.cxx = old_config
