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
    "precision",
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
    problem = field_problem(manifest)
    if problem:
        raise PackageError(f"{path} is not a valid manifest: {problem}; rebuild the package with `aotc build --force`")
    return manifest


def _is_shape(value) -> bool:
    return isinstance(value, list) and all(isinstance(e, (int, str)) and not isinstance(e, bool) for e in value)


def _tensor_problem(where: str, item, dtypes) -> str | None:
    if not isinstance(item, dict):
        return f"{where} is not an object"
    if not isinstance(item.get("name"), str) or not item["name"]:
        return f"{where}.name is not a non-empty string"
    if item.get("dtype") not in dtypes:
        return f"{where}.dtype {item.get('dtype')!r} is not one of {', '.join(dtypes)}"
    if not _is_shape(item.get("shape")):
        return f"{where}.shape is not a list of sizes and dim names"
    return None


def field_problem(manifest: dict) -> str | None:
    """The first field the runtime reads that has the wrong type or value, as 'field: problem'; None if all fit.

    The runtime reads these fields directly; a hand-edited or truncated manifest must be refused as a
    package error (exit 7), not end in a KeyError. The full contract is docs/manifest.schema.json.
    """
    from .signature import DTYPES

    dtypes = tuple(DTYPES)
    toolchain, device, signature = manifest["toolchain"], manifest["device"], manifest["signature"]
    checks = [
        (isinstance(toolchain, dict) and isinstance(toolchain.get("torch"), str), "toolchain.torch is not a string"),
        (isinstance(device, dict) and device.get("type") in ("cpu", "cuda"), "device.type is not cpu or cuda"),
        (isinstance(manifest.get("runtime", {}), dict), "runtime is not an object"),
        (isinstance(manifest["files"], dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in manifest["files"].items()),
         "files is not an object of path -> sha256"),
        (isinstance(manifest["files"], dict) and MODEL_FILE in manifest["files"], f"files does not list {MODEL_FILE}"),
        (isinstance(signature, dict) and isinstance(signature.get("inputs"), list) and isinstance(signature.get("outputs"), list),
         "signature.inputs / signature.outputs are not lists"),
    ]
    for ok, problem in checks:
        if not ok:
            return problem
    for key in ("inputs", "outputs", "state"):
        for index, item in enumerate(signature.get(key, ())):
            problem = _tensor_problem(f"signature.{key}[{index}]", item, dtypes)
            if problem:
                return problem
    dims = signature.get("dims", {})
    if not isinstance(dims, dict):
        return "signature.dims is not an object"
    for name, info in dims.items():
        if not (isinstance(info, dict) and all(isinstance(info.get(k), int) for k in ("min", "max", "example"))):
            return f"signature.dims.{name} lacks integer min, max and example"
    named = {e for item in signature["inputs"] for e in item["shape"] if isinstance(e, str)}
    if named - set(dims):
        return f"signature.inputs name dims with no range in signature.dims: {', '.join(sorted(named - set(dims)))}"
    return None


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
