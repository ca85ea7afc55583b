"""What `aotc bench` shows: the progress bar (stderr), the table (stdout), the JSON file and the plot."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path

from . import __version__


class ProgressBar:
    """One bar over the whole plan on stderr: redrawn in place on a terminal, a line now and then elsewhere."""

    def __init__(self, enabled: bool = True, stream=None, width: int = 28):
        self.enabled, self.stream, self.width = enabled, stream or sys.stderr, width
        self.total, self.done, self.started, self.last_line = 1, 0, time.perf_counter(), 0.0
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()

    def begin(self, total: float) -> None:
        """`total`: the plan's weight, the sum of its steps' weights (rough relative costs)."""
        self.total, self.done, self.started = max(1, total), 0, time.perf_counter()

    def step(self, label: str, weight: float = 1) -> None:
        """Announce the next step of the plan (the previous one is done)."""
        self._draw(label, final=False)
        self.done = min(self.done + weight, self.total)

    def note(self, text: str) -> None:
        self._draw(text, final=False, counted=False)

    def finish(self) -> None:
        self.done = self.total
        self._draw(f"done in {time.perf_counter() - self.started:.1f}s", final=True)

    def _draw(self, label: str, final: bool, counted: bool = True) -> None:
        if not self.enabled:
            return
        filled = round(self.width * self.done / self.total)
        line = (f"[aotc bench] {'#' * filled}{'.' * (self.width - filled)} {100 * self.done / self.total:3.0f}% "
                f"{time.perf_counter() - self.started:6.1f}s  {label}")
        if self.tty:
            columns = 120
            with contextlib.suppress(OSError):
                columns = os.get_terminal_size(self.stream.fileno()).columns
            self.stream.write("\r\x1b[K" + line[: columns - 1] + ("\n" if final else ""))
            self.stream.flush()
            return
        # Not a terminal (CI logs, pipes): the slow steps and a heartbeat, not one line per timed slice.
        now = time.perf_counter()
        if final or not counted or "timed round" not in label or now - self.last_line > 5:
            print(line, file=self.stream, flush=True)
            self.last_line = now


def machine_description(device) -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "cpu": cpu, "cpu_count": os.cpu_count(), "platform": f"{platform.system().lower()}-{platform.machine()}",
        "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__,
        "python": platform.python_version(), "aotc": __version__, "cuda": torch.version.cuda, "gpu": None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version())
        with contextlib.suppress(ImportError):
            import triton

            info["triton"] = triton.__version__
    return info


def _ms(value) -> str:
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
        cells = [str(cell).ljust(w) if i == 0 else str(cell).rjust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return lines


def describe_machine(report: dict) -> str:
    m = report["machine"]
    where = f"{m['gpu']} ({m.get('gpu_memory_gb')} GB), CUDA {m['cuda']}; " if m.get("gpu") else ""
    return (f"{where}{m['cpu']}, {m['cpu_count']} CPUs, {m['platform']}; torch {m['torch']}, python {m['python']}, "
            f"aotc {m['aotc']}; {m['torch_threads']} torch threads")


def format_table(report: dict) -> str:
    pkg, s = report["package"], report["settings"]
    size = f", {pkg['size_bytes'] / 1e6:.1f} MB" if pkg.get("size_bytes") else ""
    lines = [
        f"aotc bench {pkg['path']} ({pkg['model']}; {pkg['device']['type']}, mode {pkg['mode']}, {pkg['precision']}) {report['created']}",
        f"machine  {describe_machine(report)}",
        f"timing   {s['timer']}; per contender and batch size: first call, {s['warmup']} warm-up, "
        f"{s['iters']} timed calls in {s['rounds']} interleaved rounds",
        f"build    {pkg['build_seconds']:.1f} s once, ahead of time (AOTInductor){size}" if pkg.get("build_seconds") is not None else "build    -",
    ]
    memory = "CUDA allocator peak above the start" if s["memory"].startswith("cuda") else "RSS growth"
    header = ["", "median ms", "p90 ms", "p99 ms", "min ms", "stdev ms", "items/s", "first call ms", "mem MB", "package is"]
    for batch in s["batch_sizes"]:
        rows = []
        for r in (row for row in report["results"] if row["batch_size"] == batch):
            lat = r["latency"]
            mem = "-" if r["memory_mb"] is None else f"{r['memory_mb']:.1f}"
            speed = "-" if r["contender"] == "package" else _speedup(r["package_speedup"])
            rows.append([r["contender"], _ms(lat["median_ms"]), _ms(lat["p90_ms"]), _ms(lat["p99_ms"]), _ms(lat["min_ms"]),
                         _ms(lat["stdev_ms"]), f"{r['throughput_items_per_s']:,.0f}", _ms(r["first_call_ms"]), mem, speed])
        lines += ["", f"batch {batch}"] + _grid(header, rows)
    lines.append(f"(mem: {memory} during the first call and warm-up; package is: ratio of medians)")
    if report.get("cold_start"):
        cuda = s["memory"].startswith("cuda")
        header = ["cold start (fresh process)", "median ms", "min..max ms", "start+import", "load", "first call",
                  "GPU MB" if cuda else "peak RSS MB"]
        rows = []
        for c in report["cold_start"]:
            if "error" in c:
                rows.append([c["label"], "failed", "-", "-", "-", "-", "-"])
                continue
            mem = c.get("cuda_device_used_mb") if cuda else c.get("peak_rss_mb")
            rows.append([c["label"], _ms(c["median_ms"]), f"{_ms(c['min_ms'])}..{_ms(c['max_ms'])}", _ms(c["startup_ms"] + c["import_ms"]),
                         _ms(c["load_ms"]), _ms(c["first_call_ms"]), "-" if mem is None else f"{mem:.0f}"])
        lines += ["", f"cold start: process start -> first output, median of {s['cold_runs']} run(s)"] + _grid(header, rows)
        lines += [f"{c['label']}: {c['error']}" for c in report["cold_start"] if "error" in c]
    return "\n".join(lines)


def write_json(report: dict, path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _colors(names) -> dict:
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def write_plot(report: dict, path: Path) -> None:
    """Latency bars with p90 whiskers; cold-start bars by phase; latency against batch size if several."""
    from .optional import require

    require("matplotlib", "bench", "--plot")  # optional (aotc[bench]): one line naming the extra, not an ImportError
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sizes = report["settings"]["batch_sizes"]
    panels = ["latency"] + (["cold"] if measured_cold_starts(report) else []) + (["batch"] if len(sizes) > 1 else [])
    fig = Figure(figsize=(6.2 * len(panels), 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    names = [c["name"] for c in report["contenders"]]
    colors = _colors(names)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        {"latency": _latency_panel, "cold": _cold_panel, "batch": _batch_panel}[panel](ax, report, colors)
    pkg, m = report["package"], report["machine"]
    where = m["gpu"] or m["cpu"]
    fig.suptitle(f"{pkg['model']}: {pkg['device']['type']} ({where}), mode {pkg['mode']}, torch {m['torch']}, "
                 f"{m['torch_threads']} threads, {report['created'][:10]}", fontsize=10)
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def headline_batch(report: dict) -> int:
    """The batch size a one-number summary uses: the exported example size if measured, else the first."""
    sizes = report["settings"]["batch_sizes"]
    example = report["settings"].get("example_batch_size")
    return example if example in sizes else sizes[0]


def _latency_panel(ax, report, colors) -> None:
    batch = headline_batch(report)
    rows = [r for r in report["results"] if r["batch_size"] == batch]
    medians = [r["latency"]["median_ms"] for r in rows]
    above = [r["latency"]["p90_ms"] - r["latency"]["median_ms"] for r in rows]
    names = [r["contender"] for r in rows]
    labels = [f"{name}\n{_ms(median)} ms" for name, median in zip(names, medians)]
    ax.bar(labels, medians, yerr=[[0] * len(rows), above], capsize=5, color=[colors[n] for n in names])
    ax.set_ylabel("ms per call (median; whisker: p90)")
    ax.set_title(f"steady-state latency, batch {batch}", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)


def measured_cold_starts(report: dict) -> list:
    """The cold-start entries that have figures (a baseline that failed to start has an error instead)."""
    return [c for c in report.get("cold_start") or [] if "error" not in c]


def _cold_panel(ax, report, colors) -> None:
    cold = measured_cold_starts(report)
    labels = [c["label"].replace(" (", "\n(") for c in cold]
    phases = (("start + import torch", lambda c: c["startup_ms"] + c["import_ms"], 0.35),
              ("load", lambda c: c["load_ms"], 0.6), ("first call", lambda c: c["first_call_ms"], 1.0))
    bottom = [0.0] * len(cold)
    for name, value, alpha in phases:
        heights = [value(c) / 1e3 for c in cold]
        ax.bar(labels, heights, bottom=bottom, color=[colors.get(c["contender"], "#7f7f7f") for c in cold], alpha=alpha,
               edgecolor="black", linewidth=0.4)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, c in enumerate(cold):
        ax.text(x, bottom[x], f"{c['median_ms'] / 1e3:.2f}s", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds from process start to first output")
    ax.set_title(f"cold start (median of {report['settings']['cold_runs']})", fontsize=10)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor="#555555", alpha=alpha, label=name) for name, _value, alpha in phases], fontsize=7, loc="upper left")
    ax.tick_params(axis="x", labelsize=7)


def _batch_panel(ax, report, colors) -> None:
    for contender in report["contenders"]:
        rows = sorted((r for r in report["results"] if r["contender"] == contender["name"]), key=lambda r: r["batch_size"])
        x = [r["batch_size"] for r in rows]
        ax.plot(x, [r["latency"]["median_ms"] for r in rows], marker="o", color=colors[contender["name"]], label=contender["name"])
        ax.fill_between(x, [r["latency"]["median_ms"] for r in rows], [r["latency"]["p90_ms"] for r in rows],
                        color=colors[contender["name"]], alpha=0.15)
    sizes = report["settings"]["batch_sizes"]
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(size) for size in sizes])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("ms per call (median; band up to p90)")
    ax.set_title("latency against batch size", fontsize=10)
    ax.legend(fontsize=8)
