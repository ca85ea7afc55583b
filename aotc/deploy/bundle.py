"""`aotc bundle`: a package plus the C++ runner and every shared library they need, in one folder to
copy to a serving machine that has no Python.

    DIR/run            launcher: sets the library path, runs bin/aotc-runner on package/ (arguments pass through)
    DIR/bin/aotc-runner
    DIR/lib/           the libraries `ldd` resolves for the runner and the compiled model (libtorch,
                       libc10, OpenMP, OpenSSL's libcrypto, zlib, libstdc++; CUDA's for CUDA packages)
    DIR/package/       the package, as built
    DIR/public_key.pem with --public-key: the key the package must be signed with; the launcher
                       always passes it (--require-signature), so an altered package is refused

Left out, because they belong to the serving machine: the C library and loader (libc, libm,
libpthread, libdl, librt, ld-linux) and the GPU driver (libcuda, libnvidia-*).
"""

from __future__ import annotations

import os
import re
import shlex
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
KEY_FILE = "public_key.pem"
# The launcher. Shell built-ins only, but for readlink when it is reached through a symbolic link:
# it runs with an empty environment and no PATH. Each step says what it guards against.
LAUNCHER = r"""#!/bin/sh
# Run the bundled aotc package with the bundled runner: ./run [--input x.npy ...] [--output y.npz] [--iters N] [--json]
self=$0
hops=0
# Reached through a symbolic link (ln -s /opt/model/run /usr/local/bin/model): the bundle's files
# are beside the real launcher, not beside the link.
while [ -L "$self" ]; do
  hops=$((hops + 1))
  target=$(readlink -- "$self" 2>/dev/null) && [ "$hops" -le 40 ] || {
    echo "error: $self is a symbolic link this launcher cannot follow (no readlink on PATH, or a loop);" \
      "run the bundle's own run file, or put readlink on PATH" >&2
    exit 2
  }
  case $target in
    /*) self=$target ;;
    *) case $self in */*) self=${self%/*}/$target ;; *) self=$target ;; esac ;;
  esac
done
case $self in */*) here=${self%/*} ;; *) here=. ;; esac
# CDPATH unset: with it, cd may go elsewhere and print the folder, which $(...) would capture.
here=$(CDPATH= cd -P -- "${here:-/}" && pwd -P) || exit 2
# The loader splits its library path at ':' and ';' and expands '$ORIGIN'-like words in it: the
# bundle's lib/ under such a folder would become other folders, one relative to the current one.
case $here in
  *:* | *\;* | *\$*)
    echo "error: the bundle is in $here, whose path holds ':', ';' or '\$', which the library path" \
      "(LD_LIBRARY_PATH) would split or expand; move the bundle to a folder whose path has none of them" >&2
    exit 2 ;;
esac
# The caller's library path after the bundle's, its empty and relative entries left out: an empty
# entry means the current directory, where anyone may have put a libtorch.
extra=
saved_ifs=$IFS
IFS=':;'
set -f
for dir in ${LD_LIBRARY_PATH-}; do
  case $dir in /*) extra=$extra:$dir ;; esac
done
set +f
IFS=$saved_ifs
LD_LIBRARY_PATH=$here/lib$extra
export LD_LIBRARY_PATH
exec "$here/bin/aotc-runner" "$here/package" __SIGNATURE__"$@"
"""
SIGNATURE_FLAGS = f'--require-signature --public-key "$here/{KEY_FILE}" '


def launcher_text(signed: bool) -> str:
    """The launcher; a signed bundle's always passes its key (the runner refuses a second one)."""
    return LAUNCHER.replace("__SIGNATURE__", SIGNATURE_FLAGS if signed else "")


@dataclass
class BundleResult:
    output: Path
    libraries: list
    size_bytes: int
    requires_signature: bool = False
    command: str = ""  # a command line that runs what was bundled (run_command)

    def to_dict(self) -> dict:
        return {
            "bundle": str(self.output),
            "libraries": self.libraries,
            "size_bytes": self.size_bytes,
            "requires_signature": self.requires_signature,
            "command": self.command,
        }


def run_command(bundle: Path, manifest) -> str:
    """A command line that works on what was bundled: a text-generation package generates from
    token ids (the runner has no tokenizer); another package runs on seeded random inputs, and the
    inputs' own files go by the signature's names."""
    launcher = shlex.quote(f"{bundle}/run")
    if manifest.generation is not None:
        return f"{launcher} --generate --prompt-ids 5,17,42 --max-new-tokens 16"
    files = " ".join(f"--input {shlex.quote(name)}.npy" for name in manifest.signature.input_names)
    return f"{launcher} --iters 10  (random inputs; yours: {files} --output out.npz)"


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


def make_bundle(
    package: Path, output: Path, force: bool = False, public_key: Path | None = None
) -> BundleResult:
    """`public_key`: the bundle requires the package to be signed by its private key, and carries
    the key; the package is checked against it here first (exit 7 if it fails)."""
    from aotc.compiler.package_writer import commit, staging_folder
    from aotc.deploy.cpp_runner import runner_path
    from aotc_runtime import read_manifest, verify_files

    package, output = Path(package), Path(output)
    signed = None
    if public_key is not None:
        from aotc_runtime import verify_signature

        # A bundle that would refuse its own package is refused now, not on the serving machine.
        signed = verify_signature(package, public_key)
    manifest = read_manifest(
        package, signed=signed
    )  # what the runtime refuses is refused here (exit 7)
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
        if public_key is not None:
            shutil.copyfile(public_key, staging / KEY_FILE)
        launcher = staging / "run"
        launcher.write_text(launcher_text(signed=public_key is not None))
        launcher.chmod(0o755)
        size = sum(f.stat().st_size for f in staging.rglob("*") if f.is_file())
        commit(staging, output)
    return BundleResult(
        output,
        sorted(libraries),
        size,
        requires_signature=public_key is not None,
        command=run_command(output, manifest),
    )
