"""Run `aotc bench` over a list of models and write a Markdown page with the tables and plots.

    python scripts/bench_suite.py --device cpu --out docs/    # tests/models -> docs/bench_suite_cpu.md
    python scripts/bench_suite.py --device cuda --out docs/   # torchvision models -> docs/bench_suite_cuda.md

Each model is exported (dynamic batch where the suite asks for several sizes, falling back to a
static batch if torch.export or the build refuses it), built with `aotc build --mode MODE`, and benched against
eager and torch.compile. Each model's result (its bench report, or why it failed) goes to
OUT/bench/DEVICE-MODEL.json with its plot beside it, and the page is rebuilt from all the JSON
there: models can be run one command each (`--models resnet50`) and the page keeps them all.
The GPU models use torchvision's architectures with random weights (nothing to download; timings
do not depend on weight values).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"


@dataclass(frozen=True)
class SuiteModel:
    name: str
    target: str  # a model file or package.module:attr, as `aotc export` takes it
    shapes: tuple  # --input-shape per input; () -> the file's example_inputs()
    dims: tuple = ()  # --dim specs
    static_shapes: tuple = ()  # fallback shapes if the dynamic export fails
    batch_sizes: tuple = ()
    entry: str | None = None


CPU_MODELS = (
    SuiteModel(
        "mlp",
        str(ROOT / "examples" / "mlp.py"),
        ("Bx128",),
        ("B=1:64:32",),
        ("32x128",),
        (1, 32, 64),
    ),
    SuiteModel(
        "cnn_bn",
        str(MODELS / "cnn_bn.py"),
        ("Bx3x128x128",),
        ("B=1:16:16",),
        ("16x3x128x128",),
        (1, 16),
    ),
    SuiteModel("feature_pyramid", str(MODELS / "feature_pyramid.py"), ("1x3x224x224",)),
    SuiteModel("two_input", str(MODELS / "two_input.py"), ()),
    SuiteModel("sincos", str(MODELS / "sincos.py"), ("10x10", "10x10"), entry="foo"),
)
GPU_MODELS = tuple(
    SuiteModel(
        name,
        f"torchvision.models:{name}",
        ("Bx3x224x224",),
        ("B=1:64:8",),
        ("8x3x224x224",),
        (1, 8, 32),
    )
    for name in ("densenet121", "resnet50", "mobilenet_v3_large", "vit_b_16")
)
AGAINST = {
    "cpu": ("eager", "compile:default"),
    "cuda": ("eager", "compile:default", "compile:reduce-overhead", "compile:max-autotune"),
}
# docs/benchmarks.md (hand-written) links both
PAGE = {
    "cpu": "bench_suite_cpu.md",
    "cuda": "bench_suite_cuda.md",
}


def export_and_build(model: SuiteModel, args, work: Path, notes: list) -> tuple:
    """(package, whether its batch is dynamic): the dynamic batch first, a static batch if export
    or build refuses it."""
    from aotc.api import BuildConfig, ExportConfig, build, export
    from aotc.config import Mode
    from aotc.errors import BuildError, ExportError
    from aotc.export.shapes import parse_dim, parse_shape
    from aotc.progress import Progress

    artifact, package = work / f"{model.name}.pt2", work / f"{model.name}_pkg"
    attempts = [(model.shapes, model.dims)] + (
        [(model.static_shapes, ())] if model.static_shapes else []
    )
    for index, (shapes, dims) in enumerate(attempts):
        cfg = ExportConfig(
            model=display_target(model),
            output=artifact,
            input_shapes=tuple(parse_shape(s) for s in shapes),
            dims=tuple(parse_dim(d) for d in dims),
            entry=model.entry,
            force=True,
        )
        stage = "export"
        try:
            export(cfg)
            stage = "build"
            build(
                BuildConfig(
                    artifact=artifact,
                    output=package,
                    mode=Mode(args.mode),
                    device=args.device,
                    force=True,
                ),
                Progress(),
            )
            return package, bool(dims)
        except (ExportError, BuildError) as exc:
            if index == len(attempts) - 1:
                raise
            notes.append(
                f"dynamic batch {stage} failed ({str(exc)[:200]}); measured at static {' '.join(model.static_shapes)}"
            )
    raise AssertionError("unreachable")


def display_target(model: SuiteModel) -> str:
    """A model file relative to the checkout (reports show it), or the import path as is."""
    return os.path.relpath(model.target, ROOT) if Path(model.target).is_file() else model.target


def run_model(model: SuiteModel, args, work: Path, results: Path, command: str) -> dict:
    """Export, build and bench one model; write and return {'suite': ..., 'report': ... or None}."""
    from aotc.api import BenchConfig, bench
    from aotc.bench.report import write_json
    from aotc.errors import AotcError, AotcRuntimeError
    from aotc.progress import ProgressBar

    stem = f"{args.device}-{model.name}"
    suite = {
        "model": model.name,
        "target": display_target(model),
        "input": " ".join(model.shapes) or "example_inputs()",
        "build_mode": args.mode,
        "command": command,
        "notes": [],
        "error": None,
        "plot": None,
    }
    report = None
    try:
        package, dynamic = export_and_build(model, args, work, suite["notes"])
        cfg = BenchConfig(
            package=package,
            against=args.against,
            iters=args.iters,
            warmup=args.warmup,
            rounds=args.rounds,
            batch_sizes=model.batch_sizes if dynamic else (),
            cold_start=args.cold_runs > 0,
            cold_runs=max(1, args.cold_runs),
            plot_path=results / f"{stem}.png",
        )
        report = bench(cfg, ProgressBar())
        report["package"]["path"] = f"{model.name}_pkg/"  # not the temporary folder it was built in
        suite["plot"] = f"{results.name}/{stem}.png"
    except (AotcError, AotcRuntimeError) as exc:
        suite["error"] = f"{type(exc).__name__}: {exc}"
    entry = {"suite": suite, "report": report}
    write_json(entry, results / f"{stem}.json")
    print(
        f"== {model.name}: {'failed: ' + suite['error'] if suite['error'] else 'done'}",
        file=sys.stderr,
        flush=True,
    )
    return entry


def _ms(value) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:,.1f}"


def summary_row(entry: dict, against: tuple) -> list:
    from aotc.bench.report import headline_batch

    report = entry["report"]
    batch = headline_batch(report)
    rows = {r["contender"]: r for r in report["results"] if r["batch_size"] == batch}
    cells = [entry["suite"]["model"], str(batch), f"{report['package']['build_seconds']:.0f}"]
    for name in ("package",) + against:
        row = rows.get(name)
        speed = "" if name == "package" or row is None else f" ({row['package_speedup']:.2f}x)"
        cells.append("-" if row is None else f"{_ms(row['latency']['median_ms'])}{speed}")
    cold = report.get("cold_start") or []
    cells.append(
        ", ".join(
            f"{c['label'].replace(' cache', '')} "
            + ("failed" if "error" in c else f"{c['median_ms'] / 1e3:.1f}")
            for c in cold
        )
        or "-"
    )
    return cells


def write_page(entries: list, args, out: Path) -> Path:
    """The page, from every model's JSON in OUT/bench/ (this run's and earlier ones')."""
    from aotc.bench.report import describe_machine, format_table

    done = [e for e in entries if e["report"]]
    lines = [
        f"# aotc bench suite: {args.device.upper()}",
        "",
        f"Page written {time.strftime('%Y-%m-%d %H:%M %Z')} by `scripts/bench_suite.py` from the results in "
        f"`{out.name}/bench/{args.device}-*.json`; each model's section gives its date and command.",
        "",
    ]
    if done:
        against = tuple(
            dict.fromkeys(
                c["name"] for e in done for c in e["report"]["contenders"] if c["name"] != "package"
            )
        )
        machines: dict = {}  # models are measured one command at a time, possibly on different machines
        for e in done:
            machines.setdefault(describe_machine(e["report"]), []).append(e["suite"]["model"])
        if len(machines) == 1:
            lines += [f"Machine: {next(iter(machines))}.", ""]
        else:
            lines += [
                "Machines:",
                *(f"- {', '.join(models)}: {machine}." for machine, models in machines.items()),
                "",
            ]
        lines += [
            "Each package is benched against eager and torch.compile of the exported artifact it was built from, on "
            "the same inputs, interleaved in one process (iterations, timer and date in each section). Latency: median "
            "ms at the exported batch size; `(Nx)`: how many times faster the package is. Cold start: a fresh process "
            "from start to first output, seconds (median; torch.compile with a cold and a warm on-disk cache).",
            "",
            "| "
            + " | ".join(
                [
                    "model",
                    "batch",
                    "build s",
                    "package ms",
                    *(f"{n} ms" for n in against),
                    "cold start s",
                ]
            )
            + " |",
            "|" + "---|" * (len(against) + 5),
        ]
        lines += ["| " + " | ".join(summary_row(e, against)) + " |" for e in done]
    for entry in entries:
        suite = entry["suite"]
        lines += [
            "",
            f"## {suite['model']}",
            "",
            f"`{suite['target']}`, input {suite['input']}, `aotc build --mode {suite['build_mode']}`; "
            f"`{suite['command']}`",
            "",
        ]
        lines += [f"Note: {note}" for note in suite["notes"]]
        if suite["error"]:
            lines += [f"**Failed:** {suite['error']}"]
            continue
        lines += [
            "```",
            format_table(entry["report"]),
            "```",
            "",
            f"![{suite['model']}]({suite['plot']})",
        ]
    page = out / (args.page or PAGE[args.device])
    tmp = page.with_name(f".{page.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, page)
    return page


def saved_entries(models, args, results: Path) -> list:
    entries = []
    for model in models:
        path = results / f"{args.device}-{model.name}.json"
        if path.is_file():
            entries.append(json.loads(path.read_text()))
    return entries


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs",
        help="folder of the page; plots and JSON go to OUT/bench/",
    )
    parser.add_argument(
        "--page",
        help="page file name [default: bench_suite_cpu.md on cpu, bench_suite_cuda.md on cuda]",
    )
    parser.add_argument("--models", help="comma-separated subset of the device's models")
    parser.add_argument(
        "--mode",
        choices=("default", "reduce-overhead", "max-autotune"),
        default="default",
        help="build mode of the packages",
    )
    parser.add_argument(
        "--against", help="baselines, as `aotc bench --against` [default: per device]"
    )
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--cold-runs",
        type=int,
        help="fresh processes per cold-start case; 0: no cold start "
        "[default: 3 on cpu, 1 on cuda, where a cold max-autotune compile takes minutes]",
    )
    parser.add_argument(
        "--work", type=Path, help="keep artifacts and packages here [default: a temporary folder]"
    )
    parser.add_argument(
        "--page-only",
        action="store_true",
        help="measure nothing: rewrite the page from the saved results in OUT/bench/",
    )
    args = parser.parse_args(argv)
    from aotc.bench.options import parse_against

    args.against = parse_against(args.against) if args.against else AGAINST[args.device]
    if args.cold_runs is None:
        args.cold_runs = 3 if args.device == "cpu" else 1
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = " ".join(["python scripts/bench_suite.py", *argv])
    every = CPU_MODELS if args.device == "cpu" else GPU_MODELS
    models = every
    if args.models:
        wanted = args.models.split(",")
        unknown = sorted(set(wanted) - {m.name for m in every})
        if unknown:
            print(
                f"error: unknown model(s) {', '.join(unknown)}; choose from {', '.join(m.name for m in every)}",
                file=sys.stderr,
            )
            return 2
        models = tuple(m for m in every if m.name in wanted)
    args.out = args.out.resolve()
    results = args.out / "bench"
    if args.page_only:  # e.g. on a machine without the GPU the results came from
        print(f"wrote {write_page(saved_entries(every, args, results), args, args.out)}")
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda but torch sees no GPU on this machine", file=sys.stderr)
            return 2
        try:
            importlib.import_module("torchvision")  # importable, not merely installed
        except ImportError:
            print(
                "error: the GPU suite needs torchvision (pip install torchvision matching this torch)",
                file=sys.stderr,
            )
            return 2
    args.work = args.work.resolve() if args.work else None
    os.chdir(ROOT)  # model files are named relative to the checkout, as the reports show them
    results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="aotc-suite-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        failed = [
            e
            for e in (run_model(m, args, work, results, command) for m in models)
            if e["suite"]["error"]
        ]
    page = write_page(saved_entries(every, args, results), args, args.out)
    print(f"wrote {page}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
