"""The library entry points. Each CLI command is one call here; Python users can call them too."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aotc.bench.options import BenchConfig
from aotc.compiler.finish import BuildResult
from aotc.compiler.pipeline import build_package
from aotc.config import BuildConfig, ExportConfig
from aotc.deploy.bundle import BundleResult
from aotc.explain.report import ExplainConfig, ExplainReport, explain_model
from aotc.export.trace import ExportResult, export_model
from aotc.progress import Progress, ProgressBar


def export(cfg: ExportConfig, progress: Progress | None = None) -> ExportResult:
    """Trace a user's model with torch.export and save the artifact (.pt2). `progress`: its
    stages on stderr (silent when not given)."""
    return export_model(cfg, progress)


def export_onnx(artifact: str | Path, output: str | Path, force: bool = False) -> ExportResult:
    """Convert an export artifact (.pt2) to an ONNX model (needs aotc[onnx])."""
    import time

    from aotc.errors import UserInputError
    from aotc.export.artifact import load_artifact
    from aotc.export.onnx import export_to_onnx

    started = time.perf_counter()
    artifact, output = Path(artifact), Path(output)
    if not artifact.is_file():
        raise UserInputError(f"artifact {artifact} does not exist; create one with `aotc export`")
    if output.exists() and not force:
        raise UserInputError(
            f"output {output} exists; pass --force to replace it or choose another -o"
        )
    ep, meta = load_artifact(artifact)
    info = export_to_onnx(ep, meta, output)
    return ExportResult(
        output, meta.model or str(artifact), info.signature, time.perf_counter() - started
    )


def build(cfg: BuildConfig, progress: Progress | None = None) -> BuildResult:
    """Compile an export artifact ahead of time into a package folder.

    With `cfg.tune` or `cfg.specialize`, aotc.tune builds the candidates (each a plain build),
    times them and packages the winners; otherwise it is one plain build (aotc.compiler)."""
    progress = progress or Progress()
    if cfg.tune or cfg.specialize:
        from aotc.tune.driver import build_tuned

        return build_tuned(cfg, progress)
    return build_package(cfg, progress)


def run(
    package: str | Path,
    input_files: Sequence[str | Path] = (),
    output: str | Path | None = None,
    iters: int = 0,
    seed: int = 0,
    public_key: str | Path | None = None,
    threads: int = 1,
) -> dict:
    """Load a package through the thin runtime and run it (never compiles).

    `public_key` (PEM, from `aotc keygen`): refuse the package unless its private key signed it.
    `threads` > 1: `iters` calls from each of that many threads at once (throughput).
    """
    from aotc_runtime import run_package

    return run_package(
        package, input_files, output, iters, seed, public_key=public_key, threads=threads
    )


def verify(
    package: str | Path,
    public_key: str | Path | None = None,
    artifact: str | Path | None = None,
) -> dict:
    """Re-check what a package claims: manifest, file hashes, compatibility, signature (with
    `public_key`), loading, and the build's numeric check re-run against its export artifact
    (`artifact`, default: the one the manifest records). Returns the report; report["ok"] says
    whether every check passed and report["exit_code"] is the code of the first that failed.
    """
    from aotc.deploy.verify_package import verify_package

    return verify_package(
        Path(package),
        Path(public_key) if public_key is not None else None,
        Path(artifact) if artifact is not None else None,
    )


def bench(cfg: BenchConfig, progress: ProgressBar | None = None) -> dict:
    """Time a package against eager and torch.compile of its artifact; write cfg.json_path / cfg.plot_path.

    A text-generation package is timed per token against transformers' `generate` on the model its
    artifact was exported from (aotc/bench/generation_bench.py). `cfg` is a BenchConfig; `progress`
    an aotc.progress.ProgressBar (stderr). Returns the report (JSON-ready dict);
    aotc.bench.report.format_table(report) is the CLI's table.
    """
    from aotc.bench.harness import bench_package
    from aotc.bench.plot import write_plot
    from aotc.bench.report import write_json

    report = bench_package(cfg, progress)
    if cfg.json_path is not None and str(cfg.json_path) != "-":
        write_json(report, cfg.json_path)
    if cfg.plot_path is not None:
        write_plot(report, cfg.plot_path)
    return report


def bundle(
    package: str | Path,
    output: str | Path,
    force: bool = False,
    public_key: str | Path | None = None,
) -> BundleResult:
    """A folder holding the package, the C++ runner and their libraries, to run with no Python.
    `public_key`: the bundle runs the package only while it is signed by that key's private key."""
    from aotc.deploy.bundle import make_bundle

    key = Path(public_key) if public_key is not None else None
    return make_bundle(Path(package), Path(output), force, public_key=key)


def explain(cfg: ExplainConfig) -> ExplainReport:
    """Why a model does or does not export, in terms of the user's code. Writes nothing."""
    return explain_model(cfg)


__all__ = [
    "bundle",
    "BundleResult",
    "export",
    "export_onnx",
    "build",
    "run",
    "verify",
    "bench",
    "explain",
    "ExportConfig",
    "BuildConfig",
    "BenchConfig",
    "ExplainConfig",
    "ExportResult",
    "BuildResult",
    "ExplainReport",
]
