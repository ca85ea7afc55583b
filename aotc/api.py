"""The library entry points. Each CLI command is one call here; Python users can call them too."""

from __future__ import annotations

from .build import BuildResult, build_package
from .config import BuildConfig, ExportConfig
from .export import ExportResult, export_model


def export(cfg: ExportConfig) -> ExportResult:
    """Trace a user's model with torch.export and save the artifact (.pt2)."""
    return export_model(cfg)


def build(cfg: BuildConfig, progress=None) -> BuildResult:
    """Compile an export artifact ahead of time into a package folder."""
    return build_package(cfg, progress)


def run(package, input_files=(), output=None, iters: int = 0, seed: int = 0) -> dict:
    """Load a package through the thin runtime and run it (never compiles)."""
    from aotc_runtime.runner import run_package

    return run_package(package, input_files, output, iters, seed)


__all__ = ["export", "build", "run", "ExportConfig", "BuildConfig"]
