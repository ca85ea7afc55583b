"""aotc bench on the tiny MLP package: the report's fields, the table, the plot, the refusals. No timing is asserted."""

import json

import pytest
from conftest import invoke

from aotc.api import BenchConfig, bench
from aotc.bench.plot import write_plot
from aotc.bench.report import format_table
from aotc.bench.target import resolve_batch_sizes
from aotc.errors import UserInputError
from aotc_runtime import Signature

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LATENCY_KEYS = {"n", "median_ms", "p90_ms", "p99_ms", "min_ms", "stdev_ms"}


def assert_png(path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width, _channels = imread(path).shape
    assert height > 100 and width > 100


def assert_one_line_error(result, code, *fragments):
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_bench_cli_against_eager_and_compile(packages, tmp_path):
    built = packages.get("mlp")
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = invoke(
        "bench",
        built.package,
        "--against",
        "eager,compile:default",
        "--iters",
        6,
        "--warmup",
        1,
        "--rounds",
        2,
        "--no-cold-start",
        "--json",
        out_json,
        "--plot",
        out_png,
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(out_json.read_text())

    assert report["package"]["mode"] == "default" and report["package"]["device"]["type"] == "cpu"
    assert report["artifact"] == str(built.artifact.resolve())
    assert {"cpu", "cpu_count", "torch", "python", "aotc", "torch_threads"} <= set(
        report["machine"]
    )
    settings = report["settings"]
    assert settings["batch_sizes"] == [32] and settings["iters"] == 6 and settings["rounds"] == 2
    assert settings["timer"] == "perf_counter" and settings["cold_start"] is False
    assert [c["name"] for c in report["contenders"]] == ["package", "eager", "compile:default"]
    assert report["cold_start"] is None

    rows = {row["contender"]: row for row in report["results"]}
    assert set(rows) == {"package", "eager", "compile:default"}
    for row in rows.values():
        assert row["batch_size"] == 32
        assert set(row["latency"]) == LATENCY_KEYS and row["latency"]["n"] == 6
        assert (
            row["latency"]["min_ms"]
            <= row["latency"]["median_ms"]
            <= row["latency"]["p90_ms"]
            <= row["latency"]["p99_ms"]
        )
        assert (
            row["throughput_items_per_s"] > 0
            and row["first_call_ms"] > 0
            and row["package_speedup"] > 0
        )
        assert row["memory_mb"] is not None
    assert rows["package"]["package_speedup"] == 1.0

    for text in (
        "batch 32",
        "median ms",
        "p90 ms",
        "items/s",
        "package is",
        "compile:default",
        "build",
        "torch threads",
    ):
        assert text in result.stdout, result.stdout
    assert f"wrote plot {out_png}" in result.stdout
    assert "[aotc bench]" in result.stderr and "done in" in result.stderr
    assert_png(out_png)


def test_a_baseline_that_cannot_start_costs_only_its_row(packages, tmp_path, monkeypatch):
    import aotc.bench.cold as bench_cold
    from aotc.errors import ModelError, PackageError

    real_run_child = bench_cold.run_child

    def eager_cannot_start(case, *args):
        if case.name == "eager":
            raise ModelError(
                "the cold-start process of eager failed: RuntimeError: view size is not compatible"
            )
        return real_run_child(case, *args)

    monkeypatch.setattr(bench_cold, "run_child", eager_cannot_start)
    plot = tmp_path / "cold.png"
    cfg = BenchConfig(
        package=packages.get("mlp").package,
        against=("eager",),
        iters=3,
        warmup=0,
        rounds=1,
        cold_runs=2,
        plot_path=plot,
    )
    report = bench(cfg)
    cold = {entry["label"]: entry for entry in report["cold_start"]}
    assert len(cold["package"]["runs_ms"]) == 2 and cold["package"]["median_ms"] > 0
    assert (
        "view size is not compatible" in cold["eager"]["error"] and "median_ms" not in cold["eager"]
    )
    assert {r["contender"] for r in report["results"]} == {"package", "eager"}  # steady state kept
    assert "eager: the cold-start process of eager failed" in format_table(report)
    assert_png(plot)

    def package_cannot_start(case, *args):
        raise PackageError("the cold-start process of package failed: Segmentation fault")

    monkeypatch.setattr(bench_cold, "run_child", package_cannot_start)
    with pytest.raises(PackageError):
        bench(
            BenchConfig(
                package=packages.get("mlp").package,
                against=(),
                iters=2,
                warmup=0,
                rounds=1,
                cold_runs=1,
            )
        )


def test_bench_api_with_cold_start(packages, tmp_path):
    built = packages.get("mlp")
    plot = tmp_path / "cold.png"
    cfg = BenchConfig(
        package=built.package,
        against=("eager",),
        iters=3,
        warmup=0,
        rounds=1,
        cold_runs=1,
        plot_path=plot,
    )
    report = bench(cfg)
    cold = {entry["label"]: entry for entry in report["cold_start"]}
    assert set(cold) == {"package", "eager"}
    for entry in cold.values():
        assert len(entry["runs_ms"]) == 1 and entry["median_ms"] > 0
        assert entry["median_ms"] >= entry["import_ms"] + entry["load_ms"] + entry["first_call_ms"]
        assert entry["peak_rss_mb"] > 0
    assert "cold start" in format_table(report)
    assert_png(plot)


def test_bench_refuses_batch_sizes_on_a_static_batch(packages):
    result = invoke("bench", packages.get("mlp").package, "--batch-sizes", "1,8", "--no-cold-start")
    assert_one_line_error(result, 2, "--batch-sizes 1,8", "static (32)", "--dim B=MIN:MAX")


@pytest.mark.parametrize(
    "flags, code, fragments",
    [
        (["--against", "eagr"], 2, ["'eagr' is not a contender"]),
        (["--batch-sizes", "0,4"], 2, ["'0' is not a positive integer"]),
        (["--plot", "bench.jpg"], 2, ["--plot bench.jpg must end in .png"]),
        (["--iters", "0"], 2, ["--iters"]),
    ],
)
def test_bench_bad_flags(packages, flags, code, fragments):
    result = invoke("bench", packages.get("mlp").package, *flags)
    assert result.exit_code == code, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_bench_refuses_another_artifact(packages, tmp_path):
    other = tmp_path / "other.pt2"
    other.write_bytes(b"not the artifact")
    result = invoke("bench", packages.get("mlp").package, "--artifact", other, "--no-cold-start")
    assert_one_line_error(result, 2, "is not the artifact package", "sha256 differs")


def test_bench_refuses_a_folder_that_is_not_a_package(tmp_path):
    result = invoke("bench", tmp_path, "--no-cold-start")
    assert_one_line_error(result, 7, "is not an aotc package")


def test_batch_sizes_need_a_dynamic_first_dim_in_range():
    dynamic = Signature.from_json(
        {
            "inputs": [{"name": "x", "dtype": "float32", "shape": ["B", 128]}],
            "outputs": [],
            "dims": {"B": {"min": 1, "max": 64, "example": 16}},
        }
    )
    assert resolve_batch_sizes(dynamic, ()) == (16,)
    assert resolve_batch_sizes(dynamic, (1, 8, 64)) == (1, 8, 64)
    with pytest.raises(UserInputError, match="ranges 1..64"):
        resolve_batch_sizes(dynamic, (1, 128))
    static = Signature.from_json(
        {
            "inputs": [{"name": "x", "dtype": "float32", "shape": [32, 128]}],
            "outputs": [],
            "dims": {},
        }
    )
    assert resolve_batch_sizes(static, (32,)) == (32,)


def synthetic_report(sizes, cold=True) -> dict:
    """A report shaped like bench_package's, to check the table and plot without measuring."""
    names = ["package", "eager", "compile:default"]
    rows = []
    for size in sizes:
        for index, name in enumerate(names):
            median = 0.1 * (index + 1) * size**0.5
            rows.append(
                {
                    "contender": name,
                    "batch_size": size,
                    "first_call_ms": 1.0 + 1000 * (name == "compile:default"),
                    "memory_mb": 1.5,
                    "throughput_items_per_s": size * 1e3 / median,
                    "package_speedup": index + 1.0,
                    "latency": {
                        "n": 10,
                        "median_ms": median,
                        "p90_ms": median * 1.2,
                        "p99_ms": median * 1.5,
                        "min_ms": median * 0.9,
                        "stdev_ms": median * 0.1,
                    },
                }
            )
    cold_rows = [
        {
            "contender": n,
            "cache": c,
            "label": n if c is None else f"{n} ({c} cache)",
            "runs_ms": [900.0 * (i + 1)],
            "median_ms": 900.0 * (i + 1),
            "min_ms": 900.0 * (i + 1),
            "max_ms": 900.0 * (i + 1),
            "startup_ms": 50.0,
            "import_ms": 600.0,
            "load_ms": 100.0 * i,
            "first_call_ms": 150.0 + 800 * i,
            "peak_rss_mb": 300.0,
        }
        for i, (n, c) in enumerate(
            [
                ("package", None),
                ("eager", None),
                ("compile:default", "cold"),
                ("compile:default", "warm"),
            ]
        )
    ]
    return {
        "report_version": 1,
        "created": "2026-01-01T00:00:00+0000",
        "artifact": "m.pt2",
        "package": {
            "path": "pkg",
            "model": "m.py:M",
            "device": {"type": "cpu"},
            "mode": "default",
            "precision": "fp32",
            "build_seconds": 30.0,
            "size_bytes": 2_000_000,
        },
        "machine": {
            "cpu": "test cpu",
            "cpu_count": 2,
            "platform": "linux-x86_64",
            "torch_threads": 2,
            "torch": "2.x",
            "python": "3.x",
            "aotc": "0.1.0",
            "cuda": None,
            "gpu": None,
        },
        "settings": {
            "iters": 10,
            "warmup": 1,
            "rounds": 2,
            "batch_sizes": list(sizes),
            "timer": "perf_counter",
            "memory": "rss-growth",
            "cold_start": cold,
            "cold_runs": 1 if cold else 0,
            "seed": 0,
        },
        "contenders": [
            {"name": n, "kind": n.split(":")[0], "mode": None, "setup_ms": 1.0} for n in names
        ],
        "results": rows,
        "cold_start": cold_rows if cold else None,
    }


def test_plot_and_table_with_several_batch_sizes(tmp_path):
    report = synthetic_report([1, 8, 16])
    write_plot(report, tmp_path / "sizes.png")
    assert_png(tmp_path / "sizes.png")
    table = format_table(report)
    for text in ("batch 1", "batch 8", "batch 16", "compile:default (warm cache)", "2.00x faster"):
        assert text in table, table
