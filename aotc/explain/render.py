"""`aotc explain` as text for a person: the JIT view, the export view, then one verdict line."""

from __future__ import annotations

import os
import textwrap

from aotc.explain.report import NON_STRICT, STRICT, ExplainReport
from aotc.export.shapes import format_shape
from aotc.export.user_frames import Location

WIDTH = 100
ARGS_WIDTH = 60  # a graph table cell longer than this is cut (the JSON has it whole)


def render_report(report: ExplainReport, show_graphs: bool = False) -> str:
    inputs = ", ".join(f"{format_shape(i['example'])} {i['dtype']}" for i in report.inputs)
    lines = [f"aotc explain {report.model} (inputs: {inputs})", ""]
    lines += _jit_lines(report, show_graphs)
    lines.append("")
    lines += _export_lines(report)
    lines.append("")
    lines.append(_verdict(report))  # one line, never wrapped: scripts and people look for it last
    return "\n".join(lines)


def _jit_lines(report: ExplainReport, show_graphs: bool) -> list:
    jit = report.jit
    head = "JIT view (torch._dynamo.explain, what torch.compile captures at these input sizes)"
    if jit.error:
        return [head, f"  TorchDynamo could not run the model: {jit.error}"]
    lines = [
        head,
        f"  {_count(jit.graph_count, 'graph')}, {_count(jit.break_count, 'graph break')}",
    ]
    if jit.break_count:
        lines.append(
            "  each break ends a graph: torch.compile optimizes the graphs separately and runs Python between them"
        )
    for number, brk in enumerate(jit.breaks, start=1):
        lines.append(f"  break {number}: {brk.problem.kind}")
        lines += _where_lines(brk.problem.where, brk.inside)
        lines += _wrapped("why", brk.problem.reason)
        lines += _wrapped("torch", brk.torch_reason)
        lines += _wrapped("fix", brk.problem.fix)
    for number, graph in enumerate(jit.graphs, start=1):
        ops = ", ".join(graph.ops) if graph.ops else "(no ops)"
        lines += textwrap.wrap(
            f"graph {number}: {_count(len(graph.ops), 'op')}: {ops}",
            WIDTH,
            initial_indent="  ",
            subsequent_indent="      ",
        )
        if show_graphs:
            lines += _table(graph.table)
    return lines


def _export_lines(report: ExplainReport) -> list:
    lines = ["Export view (torch.export, what `aotc export` needs: the whole model as one graph)"]
    for mode, flag in ((NON_STRICT, "aotc export"), (STRICT, "aotc export --strict")):
        attempt = report.attempts[mode]
        status = "accepted" if attempt.ok else f"FAILS ({_count(len(attempt.problems), 'problem')})"
        used = "  <- used" if mode == report.mode else ""
        lines.append(f"  {mode + ':':<12} {status:<22} ({flag}){used}")
    for number, finding in enumerate(report.findings, start=1):
        # "only" when the other mode accepts the model; a failing mode may just have stopped earlier.
        accepted = [mode for mode, attempt in report.attempts.items() if attempt.ok]
        only = f" [{', '.join(finding.modes)} only]" if accepted else ""
        problem = finding.problem
        lines.append(f"  problem {number}: {problem.kind}{only}")
        lines += _where_lines(problem.where, None)
        lines += _wrapped("why", problem.reason)
        lines += _wrapped("fix", problem.fix)
        if problem.flags:
            lines += _wrapped(
                "flags",
                " ".join(problem.flags) + "  (in place of your --input-shape and --dim flags)",
            )
    return lines


def _verdict(report: ExplainReport) -> str:
    if report.exportable:
        return f"exportable: `aotc export` ({report.mode}) accepts the model"
    text = f"not exportable ({report.mode}): fix the problems above"
    if report.hint:
        text += f"; {report.hint}"
    return text


def _where_lines(where: Location | None, inside: Location | None) -> list:
    lines = []
    if where:
        lines.append(f"    at {_short(where.file)}:{where.line}")
        if where.source:
            lines.append(f"        {where.source}")
    if inside:
        lines.append(f"    inside library code {_short(inside.file)}:{inside.line}")
        if inside.source:
            lines.append(f"        {inside.source}")
    if not where and not inside:
        lines.append("    at (torch gave no line of your code)")
    return lines


def _wrapped(label: str, text: str) -> list:
    return textwrap.wrap(
        text, WIDTH, initial_indent=f"    {label}: ", subsequent_indent=" " * (len(label) + 6)
    )


def _table(rows: list) -> list:
    """The columns gm.graph.print_tabular() shows, aligned, indented under their graph."""
    header = ["opcode", "name", "target", "args"]
    cells = [header] + [[_cut(str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    out = []
    for index, row in enumerate(cells):
        out.append(
            "      " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
        )
        if index == 0:
            out.append("      " + "  ".join("-" * width for width in widths))
    return out


def _cut(text: str) -> str:
    return text if len(text) <= ARGS_WIDTH else text[: ARGS_WIDTH - 3] + "..."


def _short(path: str) -> str:
    """A path relative to the current folder when it lies below it: shorter, and still clickable."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
