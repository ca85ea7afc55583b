"""What `aotc bench` reports: the table (stdout) and the JSON file, and what they say of the
package benched; the plot is aotc/bench/plot.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aotc_runtime import Manifest

REPORT_VERSION = 1


def format_ms(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:,.0f}"


def _speedup(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x faster" if value >= 1 else f"{1 / value:.2f}x slower"


def _grid(header: list, rows: list) -> list:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = []
    for row in [header] + rows:
        cells = [
            str(cell).ljust(w) if i == 0 else str(cell).rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def describe_machine(report: dict) -> str:
    m = report["machine"]
    where = f"{m['gpu']} ({m.get('gpu_memory_gb')} GB), CUDA {m['cuda']}; " if m.get("gpu") else ""
    return (
        f"{where}{m['cpu']}, {m['cpu_count']} CPUs, {m['platform']}; torch {m['torch']}, python {m['python']}, "
        f"aotc {m['aotc']}; {m['torch_threads']} torch threads"
    )


def _heading(report: dict, timing: str) -> list:
    """The lines above the tables: what was benched, on what machine, how, and its build."""
    pkg = report["package"]
    size = f", {pkg['size_bytes'] / 1e6:.1f} MB" if pkg.get("size_bytes") else ""
    tuned = (
        [f"tuned    {pkg['tuning']}"] if pkg.get("tuning") else []
    )  # which candidate each model of the package is
    quantized = f", {pkg['quantization']}" if pkg.get("quantization") else ""
    return [
        f"aotc bench {pkg['path']} ({pkg['model']}; {pkg['device']['type']}, mode {pkg['mode']}, "
        f"{pkg['precision']}{quantized}) {report['created']}",
        f"machine  {describe_machine(report)}",
        f"timing   {timing}",
        f"build    {pkg['build_seconds']:.1f} s once, ahead of time ({pkg.get('backend', 'aotinductor')}){size}"
        if pkg.get("build_seconds") is not None
        else "build    -",
        *tuned,
    ]


def format_table(report: dict) -> str:
    if report.get("task") == "text-generation":
        return format_generation_table(report)
    s = report["settings"]
    lines = _heading(
        report,
        f"{s['timer']}; per contender and batch size: first call, {s['warmup']} warm-up, "
        f"{s['iters']} timed calls in {s['rounds']} interleaved rounds",
    )
    memory = (
        "CUDA allocator peak above the start" if s["memory"].startswith("cuda") else "RSS growth"
    )
    header = [
        "",
        "median ms",
        "p90 ms",
        "p99 ms",
        "min ms",
        "stdev ms",
        "items/s",
        "first call ms",
        "mem MB",
        "package is",
    ]
    for batch in s["batch_sizes"]:
        rows = []
        for r in (row for row in report["results"] if row["batch_size"] == batch):
            lat = r["latency"]
            mem = "-" if r["memory_mb"] is None else f"{r['memory_mb']:.1f}"
            speed = "-" if r["contender"] == "package" else _speedup(r["package_speedup"])
            name = r["contender"]
            if r.get("ran") not in (None, "."):  # a --specialize member answered
                name += f" ({r['ran']})"
            rows.append(
                [
                    name,
                    format_ms(lat["median_ms"]),
                    format_ms(lat["p90_ms"]),
                    format_ms(lat["p99_ms"]),
                    format_ms(lat["min_ms"]),
                    format_ms(lat["stdev_ms"]),
                    f"{r['throughput_items_per_s']:,.0f}",
                    format_ms(r["first_call_ms"]),
                    mem,
                    speed,
                ]
            )
        lines += ["", f"batch {batch}"] + _grid(header, rows)
    lines.append(f"(mem: {memory} during the first call and warm-up; package is: ratio of medians)")
    if report.get("cold_start"):
        cuda = s["memory"].startswith("cuda")
        header = [
            "cold start (fresh process)",
            "median ms",
            "min..max ms",
            "start+import",
            "load",
            "first call",
            "GPU MB" if cuda else "peak RSS MB",
        ]
        rows = []
        for c in report["cold_start"]:
            if "error" in c:
                rows.append([c["label"], "failed", "-", "-", "-", "-", "-"])
                continue
            mem = c.get("cuda_device_used_mb") if cuda else c.get("peak_rss_mb")
            rows.append(
                [
                    c["label"],
                    format_ms(c["median_ms"]),
                    f"{format_ms(c['min_ms'])}..{format_ms(c['max_ms'])}",
                    format_ms(c["startup_ms"] + c["import_ms"]),
                    format_ms(c["load_ms"]),
                    format_ms(c["first_call_ms"]),
                    "-" if mem is None else f"{mem:.0f}",
                ]
            )
        lines += [
            "",
            f"cold start: process start -> first output, median of {s['cold_runs']} run(s)",
        ] + _grid(header, rows)
        lines += [f"{c['label']}: {c['error']}" for c in report["cold_start"] if "error" in c]
    return "\n".join(lines)


def format_generation_table(report: dict) -> str:
    """A text-generation package's report (aotc/bench/generation_bench.py): a row per contender."""
    s = report["settings"]
    versus = f"; transformers {s['transformers']}" if s.get("transformers") else ""
    lines = _heading(
        report,
        f"greedy generation of {s['new_tokens']} new tokens after a {s['prompt_tokens']}-token "
        f"prompt (batch 1); per contender {s['warmup']} warm-up, {s['rounds']} interleaved rounds; "
        f"{s['timer']}{versus}",
    )
    from aotc.bench.generation import stalled

    header = [
        "",
        "first token ms",
        "decode tokens/s",
        "p50 ms/token",
        "p99 ms/token",
        "mean tokens/s",
        "tokens equal",
        "decode vs eager",
    ]
    rows = []
    for r in report["results"]:
        if "error" in r:
            rows.append([r["contender"], "failed", "-", "-", "-", "-", "-", "-"])
            continue
        mean = r.get("decode_mean_tokens_per_s")  # absent from reports made before it existed
        equal = {None: "-", True: "yes", False: f"no (from {r.get('first_different_token')})"}
        speedup = r["decode_speedup_vs_eager"]
        rows.append(
            [
                r["contender"],
                format_ms(r["first_token_ms"]),
                f"{r['decode_tokens_per_s']:,.1f}",
                format_ms(r["inter_token_ms"]["p50"]),
                format_ms(r["inter_token_ms"]["p99"]),
                "-" if mean is None else f"{mean:,.1f}",
                equal[r["tokens_equal"]],
                "-" if speedup is None else f"{speedup:.2f}x",
            ]
        )
    lines += [""] + _grid(header, rows)
    lines += [f"{r['contender']}: {r['error']}" for r in report["results"] if "error" in r]
    lines += [
        f"{r['contender']}: stalls: its mean rate is {r['decode_mean_tokens_per_s'] / r['decode_tokens_per_s']:.2f} "
        f"of its typical token's (p99 {format_ms(r['inter_token_ms']['p99'])} ms): other work on "
        f"this machine, or more CPU threads than free cores; rerun with fewer, --threads N"
        for r in report["results"]
        if stalled(r)
    ]
    lines.append(
        "(first token: call to the first new token on the host, median of rounds; decode: "
        "1000 / p50; p50/p99: gaps between tokens, every round; mean: tokens 2..N over their "
        "time, stalls included; decode vs eager: eager's p50 over this p50; tokens equal: to the "
        "package's)"
    )
    return "\n".join(lines)


def write_json(report: dict, path: Path) -> None:
    from aotc_runtime import write_text_atomically

    write_text_atomically(path, json.dumps(report, indent=2) + "\n")


def headline_batch(report: dict) -> int:
    """The batch size a one-number summary uses: the exported example size if measured, else the first."""
    sizes = report["settings"]["batch_sizes"]
    example = report["settings"].get("example_batch_size")
    return example if example in sizes else sizes[0]


def measured_cold_starts(report: dict) -> list:
    """The cold-start entries that have figures (a baseline that failed to start has an error instead)."""
    return [c for c in report.get("cold_start") or [] if "error" not in c]


def package_summary(package: Path, manifest: Manifest) -> dict:
    """The report's "package": what was benched, as its manifest says."""
    return {
        "path": str(package),
        "model": manifest.model,
        "device": manifest.device.to_json(),
        "mode": manifest.mode,
        "precision": manifest.precision,
        "build_seconds": manifest.build_seconds,
        "size_bytes": manifest.size_bytes,
        "backend": manifest.backend,
        "tuning": tuning_summary(manifest),
        "quantization": quantization_summary(manifest),
    }


def quantization_summary(manifest: Manifest) -> str | None:
    """'int4-weight-only, group 64' for a quantized package, else None."""
    record = manifest.quantization
    if not record:
        return None
    group = f", group {record['group_size']}" if record.get("group_size") else ""
    return f"{record['scheme']}{group}"


def tuning_summary(manifest: Manifest) -> str | None:
    """'dynamic: onnxruntime; B=8: freezing' for a tuned or specialized package, else None."""
    if not manifest.tuning:
        return None
    return "; ".join(
        f"{variant.get('label', '')}: {variant['chosen']}"
        for variant in manifest.tuning.get("variants", [])
    )
