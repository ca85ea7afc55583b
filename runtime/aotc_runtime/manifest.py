"""The package format: `manifest.json` plus the files it lists with their sha256.

This module is the one contract between aotc (which writes packages) and the runtime (which reads
them). Bump FORMAT_VERSION on any change a reader of the old format would misread.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .errors import PackageError

FORMAT_VERSION = 2
# Format 1 lacked the signature's output_structure, keyword inputs and state; this reader fills in
# what those packages mean, so they keep loading. A format-1 reader refuses format 2.
READABLE_VERSIONS = (1, 2)
MANIFEST_NAME = "manifest.json"
MODEL_FILE = "model.pt2"
STATE_FILE = "state.pt"  # initial values of the state carried between calls (signature["state"])

REQUIRED_KEYS = (
    "format_version",
    "aotc_version",
    "created",
    "toolchain",
    "device",
    "mode",
    "inductor_options",
    "signature",
    "files",
    "build_seconds",
    "numeric_check",
)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_package_files(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` except the manifest itself, keyed by relative path."""
    folder = Path(folder)
    hashes = {}
    for root, _dirs, names in os.walk(folder):
        for name in sorted(names):
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if rel != MANIFEST_NAME:
                hashes[rel] = sha256_file(path)
    return dict(sorted(hashes.items()))


def read_manifest(folder: Path) -> dict:
    """Read and sanity-check a package's manifest; every failure names the package and the fix."""
    folder = Path(folder)
    if not folder.is_dir():
        hint = " (it is a file: pass the package folder that `aotc build` wrote)" if folder.exists() else ""
        raise PackageError(f"package folder {folder} does not exist{hint}; build one with `aotc build ARTIFACT.pt2 -o {folder}`")
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise PackageError(f"{folder} is not an aotc package: it has no {MANIFEST_NAME}; rebuild it with `aotc build`")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageError(f"{path} is not valid JSON ({exc}); rebuild the package with `aotc build`") from None
    if not isinstance(manifest, dict):
        raise PackageError(f"{path} is not an aotc manifest; rebuild the package with `aotc build`")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise PackageError(f"{path} lacks {', '.join(missing)}; rebuild the package with `aotc build`")
    version = manifest["format_version"]
    if version not in READABLE_VERSIONS:
        raise PackageError(
            f"{folder} has package format {version}, this runtime reads formats {', '.join(map(str, READABLE_VERSIONS))}; "
            "rebuild the package with the aotc that matches this runtime"
        )
    return manifest


def verify_files(folder: Path, manifest: dict) -> None:
    """Refuse a package whose files differ from what the manifest recorded at build time."""
    expected: dict[str, str] = manifest["files"]
    problems = []
    for rel, digest in expected.items():
        path = Path(folder) / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif sha256_file(path) != digest:
            problems.append(f"{rel} was modified (sha256 differs from the manifest)")
    if problems:
        raise PackageError(f"package {folder} is damaged: {'; '.join(problems)}; rebuild it with `aotc build --force`")
