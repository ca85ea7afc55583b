"""The library entry points. Each CLI command is one call here; Python users can call them too."""

from __future__ import annotations

from .bench import BenchConfig
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


def bench(cfg: BenchConfig, progress=None) -> dict:
    """Time a package against eager and torch.compile of its artifact; write cfg.json_path / cfg.plot_path.

    `cfg` is a BenchConfig; `progress` an aotc.bench_report.ProgressBar (stderr).
    Returns the report (JSON-ready dict); aotc.bench_report.format_table(report) is the CLI's table.
    """
    from .bench import bench_package
    from .bench_report import write_json, write_plot

    report = bench_package(cfg, progress)
    if cfg.json_path is not None and str(cfg.json_path) != "-":
        write_json(report, cfg.json_path)
    if cfg.plot_path is not None:
        write_plot(report, cfg.plot_path)
    return report


__all__ = ["export", "build", "run", "bench", "ExportConfig", "BuildConfig", "BenchConfig"]


def explain(cfg):
    """Why a model does or does not export: an aotc.explain.ExplainReport (cfg: aotc.explain.ExplainConfig). Writes nothing."""
    from .explain import explain_model

    return explain_model(cfg)
