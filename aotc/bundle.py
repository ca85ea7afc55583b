"""`aotc bundle`: a package plus the C++ runner and every shared library they need, in one folder to
copy to a serving machine that has no Python.

    DIR/run            launcher: sets the library path, runs bin/aotc-runner on package/ (arguments pass through)
    DIR/bin/aotc-runner
    DIR/lib/           the libraries `ldd` resolves for the runner and the compiled model (libtorch,
                       libc10, OpenMP, OpenSSL's libcrypto, zlib, libstdc++; CUDA's for CUDA packages)
    DIR/package/       the package, as built

Left out, because they belong to the serving machine: the C library and loader (libc, libm,
libpthread, libdl, librt, ld-linux) and the GPU driver (libcuda, libnvidia-*).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from aotc.errors import BuildError, UserInputError

SYSTEM_LIBRARIES = re.compile(
    r"^(libc|libm|libdl|libpthread|librt|libutil|ld-linux[-\w]*|libcuda|libnvidia-[\w-]+)\.so"
)
LAUNCHER = """#!/bin/sh
# Run the bundled aotc package with the bundled runner: ./run [--input x.npy ...] [--output y.npz] [--iters N] [--json]
# Only shell built-ins here: it works with an empty environment and no PATH.
case "$0" in */*) here=${0%/*} ;; *) here=. ;; esac
here=$(cd "$here" && pwd)
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$here/bin/aotc-runner" "$here/package" "$@"
"""


@dataclass
class BundleResult:
    output: Path
    libraries: list
    size_bytes: int

    def to_dict(self) -> dict:
        return {
            "bundle": str(self.output),
            "libraries": self.libraries,
            "size_bytes": self.size_bytes,
        }


def shared_libraries(binary: Path, search: list | None = None) -> dict:
    """soname -> resolved path of every library `ldd` lists for `binary`, system ones left out.

    `search`: folders to look in first (LD_LIBRARY_PATH), for libraries the binary finds at run
    time only because the process already loaded them (the compiled model's libtorch).
    """
    ldd = shutil.which("ldd")
    if ldd is None:
        raise UserInputError(
            "aotc bundle needs ldd (from the C library's tools) to find the runner's libraries"
        )
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(map(str, search or []))}
    listing = subprocess.run([ldd, str(binary)], capture_output=True, text=True, env=env).stdout
    found, missing = {}, []
    for line in listing.splitlines():
        match = re.match(r"\s*(\S+) => (not found|\S+)", line)
        if not match or SYSTEM_LIBRARIES.match(match.group(1)):
            continue
        if match.group(2) == "not found":
            missing.append(match.group(1))
        else:
            found[match.group(1)] = Path(match.group(2))
    if missing:
        raise BuildError(
            f"{binary.name} needs {', '.join(missing)}, which ldd cannot find here; install them or fix LD_LIBRARY_PATH"
        )
    return found


def model_libraries(package: Path, work: Path, search: list) -> dict:
    """The libraries of the compiled model inside model.pt2 (the runner loads it at run time)."""
    found = {}
    with zipfile.ZipFile(package / "model.pt2") as archive:
        for name in archive.namelist():
            if name.endswith(".so"):
                found.update(shared_libraries(Path(archive.extract(name, work)), search))
    return found


def make_bundle(package: Path, output: Path, force: bool = False) -> BundleResult:
    from aotc.build.package_writer import commit, staging_folder
    from aotc.cpp_runner import runner_path
    from aotc_runtime import read_manifest, verify_files

    package, output = Path(package), Path(output)
    manifest = read_manifest(package)  # a package the runtime would refuse is refused here (exit 7)
    verify_files(package, manifest)
    if output.exists() and not force:
        raise UserInputError(f"{output} exists; pass --force to replace it, or choose another -o")
    runner = runner_path()
    with tempfile.TemporaryDirectory(prefix="aotc-bundle-") as work:
        libraries = shared_libraries(runner)
        folders = sorted({str(path.parent) for path in libraries.values()})
        libraries.update(model_libraries(package, Path(work), folders))
    with staging_folder(output) as staging:
        (staging / "bin").mkdir()
        (staging / "lib").mkdir()
        shutil.copy2(runner, staging / "bin" / "aotc-runner")
        for soname, path in sorted(libraries.items()):
            shutil.copy2(
                path.resolve(), staging / "lib" / soname
            )  # the real file, under the name the loader asks for
        shutil.copytree(package, staging / "package")
        launcher = staging / "run"
        launcher.write_text(LAUNCHER)
        launcher.chmod(0o755)
        size = sum(f.stat().st_size for f in staging.rglob("*") if f.is_file())
        commit(staging, output)
    return BundleResult(output, sorted(libraries), size)
