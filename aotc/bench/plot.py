"""`aotc bench --plot`: latency bars with p90 whiskers, cold start by phase, latency against batch size.

matplotlib is optional (`aotc[bench]`) and imported only here.
"""

from __future__ import annotations

from pathlib import Path

from aotc.bench.report import format_ms, headline_batch, measured_cold_starts


def _colors(names) -> dict:
    palette = [
        "#1f77b4",
        "#ff7f0e",
        "#2ca02c",
        "#d62728",
        "#9467bd",
        "#8c564b",
        "#e377c2",
        "#7f7f7f",
    ]
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def write_plot(report: dict, path: Path) -> None:
    """Latency bars with p90 whiskers; cold-start bars by phase; latency against batch size if several."""
    from aotc.optional import require

    # optional (aotc[bench]): one line naming the extra, not an ImportError
    require("matplotlib", "bench", "--plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sizes = report["settings"]["batch_sizes"]
    panels = (
        ["latency"]
        + (["cold"] if measured_cold_starts(report) else [])
        + (["batch"] if len(sizes) > 1 else [])
    )
    fig = Figure(figsize=(6.2 * len(panels), 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    names = [c["name"] for c in report["contenders"]]
    colors = _colors(names)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        {"latency": _latency_panel, "cold": _cold_panel, "batch": _batch_panel}[panel](
            ax, report, colors
        )
    pkg, m = report["package"], report["machine"]
    where = m["gpu"] or m["cpu"]
    fig.suptitle(
        f"{pkg['model']}: {pkg['device']['type']} ({where}), mode {pkg['mode']}, torch {m['torch']}, "
        f"{m['torch_threads']} threads, {report['created'][:10]}",
        fontsize=10,
    )
    from aotc_runtime import replaced_atomically

    with replaced_atomically(
        path
    ) as tmp:  # matplotlib picks the format from the suffix, which stays
        fig.savefig(tmp, dpi=110)


def _latency_panel(ax, report, colors) -> None:
    batch = headline_batch(report)
    rows = [r for r in report["results"] if r["batch_size"] == batch]
    medians = [r["latency"]["median_ms"] for r in rows]
    above = [r["latency"]["p90_ms"] - r["latency"]["median_ms"] for r in rows]
    names = [r["contender"] for r in rows]
    labels = [f"{name}\n{format_ms(median)} ms" for name, median in zip(names, medians)]
    ax.bar(
        labels, medians, yerr=[[0] * len(rows), above], capsize=5, color=[colors[n] for n in names]
    )
    ax.set_ylabel("ms per call (median; whisker: p90)")
    ax.set_title(f"steady-state latency, batch {batch}", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)


def _cold_panel(ax, report, colors) -> None:
    cold = measured_cold_starts(report)
    labels = [c["label"].replace(" (", "\n(") for c in cold]
    phases = (
        ("start + import torch", lambda c: c["startup_ms"] + c["import_ms"], 0.35),
        ("load", lambda c: c["load_ms"], 0.6),
        ("first call", lambda c: c["first_call_ms"], 1.0),
    )
    bottom = [0.0] * len(cold)
    for _name, value, alpha in phases:
        heights = [value(c) / 1e3 for c in cold]
        ax.bar(
            labels,
            heights,
            bottom=bottom,
            color=[colors.get(c["contender"], "#7f7f7f") for c in cold],
            alpha=alpha,
            edgecolor="black",
            linewidth=0.4,
        )
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, c in enumerate(cold):
        ax.text(x, bottom[x], f"{c['median_ms'] / 1e3:.2f}s", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds from process start to first output")
    ax.set_title(f"cold start (median of {report['settings']['cold_runs']})", fontsize=10)
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(facecolor="#555555", alpha=alpha, label=name) for name, _value, alpha in phases
        ],
        fontsize=7,
        loc="upper left",
    )
    ax.tick_params(axis="x", labelsize=7)


def _batch_panel(ax, report, colors) -> None:
    for contender in report["contenders"]:
        rows = sorted(
            (r for r in report["results"] if r["contender"] == contender["name"]),
            key=lambda r: r["batch_size"],
        )
        x = [r["batch_size"] for r in rows]
        ax.plot(
            x,
            [r["latency"]["median_ms"] for r in rows],
            marker="o",
            color=colors[contender["name"]],
            label=contender["name"],
        )
        ax.fill_between(
            x,
            [r["latency"]["median_ms"] for r in rows],
            [r["latency"]["p90_ms"] for r in rows],
            color=colors[contender["name"]],
            alpha=0.15,
        )
    sizes = report["settings"]["batch_sizes"]
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(size) for size in sizes])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("ms per call (median; band up to p90)")
    ax.set_title("latency against batch size", fontsize=10)
    ax.legend(fontsize=8)
