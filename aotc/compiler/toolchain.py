"""The C++ compiler Inductor uses for the model .so, and the link flag aotc adds to it.

Why -Wl,-Bsymbolic (kept on by default as a second guard): the model .so carries its own copies of
C++ standard-library template code (std::regex and friends, from the system g++ headers). Without
-Bsymbolic the dynamic linker binds those names to copies already exported by the torch libraries
in the process, which may come from another toolchain; on the GPU machine (torch 2.11 + g++ 13.3)
that mix crashes inside `parse_device_str`'s std::regex on load. With -Bsymbolic the .so binds to its
own copies. Where the copies already agree it changes nothing observable.

Which g++: the one installed beside the libstdc++ this process (and so a serving process) loads,
i.e. the compiler that library was built for. Measured on the GPU machine (torch 2.11, system
libstdc++ in /usr/lib): $CXX points to /opt/gcc/bin/g++ (also GCC 13 headers, but its own build of
the runtime pieces) and every package it builds crashes on load, even with -Bsymbolic; /usr/bin/g++
builds packages that load and run, with or without -Bsymbolic. So: first the g++ in the same
installation prefix as the loaded libstdc++ (/usr/lib/... -> /usr/bin/g++), then $CXX and g++ on
PATH whose headers are not newer than that libstdc++. AOTC_CXX forces a compiler without checks.

How: Inductor takes the compiler from `torch._inductor.config.cpp.cxx` (its name must contain g++
or gcc). aotc points it at a tiny wrapper that appends the flag only to the command that links the
shared object (`-shared`): adding it to every command breaks Inductor's precompiled-header step.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from aotc.env_vars import env_set
from aotc.errors import BuildError
from aotc_runtime import write_text_atomically

LINK_FLAG = "-Wl,-Bsymbolic"

_WRAPPER = """#!/bin/sh
# Written by aotc (aotc/compiler/toolchain.py): link shared objects with {flag}, compile everything else as is.
for arg in "$@"; do
  if [ "$arg" = "-shared" ]; then exec "{real}" "$@" {flag}; fi
done
exec "{real}" "$@"
"""


def loaded_libstdcxx() -> str | None:
    """Real path of the libstdc++ mapped into this process once torch is imported (Linux only)."""
    importlib.import_module(
        "torch"
    )  # torch's libraries pull in the libstdc++ a serving process will use

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split()
        if fields and "/libstdc++.so" in fields[-1]:
            return os.path.realpath(fields[-1])
    return None


# Newest symbol version a libstdc++ exports -> the GCC release that shipped it
# (https://gcc.gnu.org/onlinedocs/libstdc++/manual/abi.html).
_GLIBCXX_TO_GCC = {26: 9, 27: 9, 28: 10, 29: 11, 30: 12, 31: 13, 32: 13, 33: 14, 34: 15}


def library_gcc_release(library: str) -> int | None:
    """GCC release of a libstdc++.so, from the newest GLIBCXX_3.4.N version it defines."""
    try:
        data = Path(library).read_bytes()
    except OSError:
        return None
    versions = [int(n) for n in re.findall(rb"GLIBCXX_3\.4\.(\d+)", data)]
    if not versions:
        return None
    newest = max(versions)
    return _GLIBCXX_TO_GCC.get(newest, 99 if newest > max(_GLIBCXX_TO_GCC) else None)


def compiler_gcc_release(cxx: str) -> int | None:
    """_GLIBCXX_RELEASE of the C++ headers `cxx` compiles against (its GCC major version)."""
    try:
        out = subprocess.run(
            [cxx, "-x", "c++", "-dM", "-E", "-include", "bits/c++config.h", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"#define _GLIBCXX_RELEASE (\d+)", out)
    return int(match.group(1)) if match else None


def compiler_beside(library: str | None) -> str | None:
    """The g++ of the installation that holds `library` (/usr/lib/x86_64-linux-gnu/... -> /usr/bin/g++)."""
    if not library:
        return None
    for prefix in Path(library).parents:
        candidate = prefix / "bin" / "g++"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def candidate_compilers(preferred: str | None = None) -> list[str]:
    """`preferred`, $CXX, g++ on PATH, /usr/bin/g++: the existing ones, each real binary once."""
    found, seen = [], set()
    for name in (preferred, os.environ.get("CXX"), "g++", "/usr/bin/g++"):
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
            raise BuildError(
                f"AOTC_CXX={forced} is not an executable; point it at a g++ binary or unset it"
            )
        return path, {"cxx_choice": "AOTC_CXX"}
    library = loaded_libstdcxx()
    beside = compiler_beside(library)
    candidates = candidate_compilers(beside)
    if not candidates:
        raise BuildError(
            "no C++ compiler found: install g++ (or set CXX / AOTC_CXX to a g++ binary)"
        )
    available = library_gcc_release(library) if library else None
    record = {"libstdcxx": library, "libstdcxx_gcc_release": available}
    if beside is not None:
        return beside, {
            **record,
            "cxx_headers_gcc_release": compiler_gcc_release(beside),
            "cxx_choice": "installed beside the libstdc++ torch loads",
        }
    if available is None:
        return candidates[0], {
            **record,
            "cxx_choice": "first available (libstdc++ release unknown)",
        }
    for path in candidates:
        headers = compiler_gcc_release(path)
        if headers is not None and headers <= available:
            return path, {
                **record,
                "cxx_headers_gcc_release": headers,
                "cxx_choice": "headers not newer than the libstdc++ torch loads",
            }
    releases = ", ".join(f"{p} (GCC {compiler_gcc_release(p)})" for p in candidates)
    raise BuildError(
        f"every g++ found ({releases}) has C++ headers newer than the libstdc++ torch loads "
        f"(GCC {available}, {library}); "
        "its packages would crash on load: install a g++ of that release or older, or set AOTC_CXX"
    )


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
    path = (
        folder / f"aotc-{tag}-g++"
    )  # Inductor recognises the compiler family by "g++" in the name
    if not path.is_file() or path.read_text() != content:
        write_text_atomically(path, content, mode=0o755)
    return path


def compiler_options(bsymbolic: bool) -> tuple[dict, dict]:
    """(Inductor options that select the compiler, what the manifest records about it)."""
    real, choice = choose_compiler()
    record = {
        "cxx": real,
        "cxx_version": compiler_version(real),
        "link_flags": [LINK_FLAG] if bsymbolic else [],
        **choice,
    }
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

    config = sys.modules.get("torch._inductor.config")
    old_config = config.cpp.cxx if config is not None else None
    if config is not None:
        config.cpp.cxx = (None, cxx)
    try:
        with env_set(CXX=cxx):
            yield
    finally:
        if config is not None:
            config.cpp.cxx = old_config
