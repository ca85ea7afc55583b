"""Where `--tune` keeps what it built and measured, so a rerun of the same search takes seconds.

A candidate's build is keyed by everything that decides its bytes: the artifact's sha256, the
sizes it is specialized to, the backend and the exact Inductor options, mode, precision, device
(GPU model, CPU ISA), tolerances and the versions of aotc, torch, Triton and ONNX Runtime. A
search's measurement is keyed by its candidates' keys: the same candidates on the same machine
reuse it. Builds cut off by the budget are not kept (a larger budget may finish them).

The folder is $AOTC_CACHE_DIR, else $XDG_CACHE_HOME/aotc, else ~/.cache/aotc; removing it is
always safe. It is an input, not a trusted store: whoever can write it can change what a build
produces, so it is created private (0700) and refused when another user owns it or others can
write it; a cached package is checked against its own manifest before use (a damaged one is
removed and built again), and the assembled package's numeric check runs against the user's
artifact whether its models came from the cache or not (aotc/tune/driver.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

CACHE_LAYOUT = 1  # bump when what a key covers changes


def key_of(data: dict) -> str:
    text = json.dumps({"layout": CACHE_LAYOUT, **data}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def machine_versions(device: str) -> dict:
    """The versions and hardware a build's bytes and speed depend on: what a package records of
    the machine it is built on (aotc/compiler/manifest.py), and the CPU's features or the GPU."""
    import torch

    from aotc import __version__
    from aotc.compiler.manifest import triton_version
    from aotc_runtime import running_environment

    versions = {"aotc": __version__, **running_environment()}
    if device == "cuda":
        from aotc_runtime import gpu_description

        versions["gpu"] = gpu_description(torch.cuda.current_device())
        versions["triton"] = triton_version()
    else:
        from aotc_runtime import cpu_features

        versions["cpu"] = sorted(cpu_features() or ())
    try:
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return versions


class TuneCache:
    """builds/<key>/{package/, record.json} and searches/<key>.json under one root."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def build_dir(self, key: str) -> Path:
        return self.root / "builds" / key

    def read_build(self, key: str) -> dict | None:
        return _read_json(self.build_dir(key) / "record.json")

    def write_build(self, key: str, record: dict) -> None:
        _write_json(self.build_dir(key) / "record.json", record)

    def forget_build(self, key: str) -> None:
        shutil.rmtree(self.build_dir(key), ignore_errors=True)

    def read_search(self, key: str) -> dict | None:
        return _read_json(self.root / "searches" / f"{key}.json")

    def write_search(self, key: str, record: dict) -> None:
        _write_json(self.root / "searches" / f"{key}.json", record)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict) -> None:
    from aotc_runtime import write_text_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(data, indent=2, default=str) + "\n")
