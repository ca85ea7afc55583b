"""`aotc build` without tuning: export artifact -> package folder (compiled model + manifest.json).

The device resolved and the config checked, then the backend the config names
(aotc/compiler/backends/: AOTInductor, ONNX Runtime) builds the package. Tuned and specialized builds
are aotc/tune's: it builds each candidate this way and packages the winners; aotc/api.py chooses.
"""

from __future__ import annotations

import time

from aotc.compiler.backends import backend
from aotc.compiler.finish import BuildResult
from aotc.config import BuildConfig, Mode, resolve_device
from aotc.progress import Progress


def prepare(cfg: BuildConfig, progress: Progress) -> BuildConfig:
    """`cfg` with --device auto resolved (said on `progress`), then validated: the first step of
    every build, tuned or not."""
    cfg, resolved = resolve_device(cfg)  # auto -> cpu/cuda first: validate() judges the real target
    if resolved:
        progress.note(resolved)
    cfg.validate()
    return cfg


def build_package(cfg: BuildConfig, progress: Progress | None = None) -> BuildResult:
    progress = progress or Progress()
    started = time.perf_counter()
    cfg = prepare(cfg, progress)
    return backend(cfg.backend).build(cfg, progress, started)


__all__ = ["build_package", "prepare", "BuildResult", "Mode"]
