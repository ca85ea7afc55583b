"""`aotc explain`: why a model does or does not export, in terms of the user's code. Writes nothing.

Registered on the `aotc` group in aotc/cli/main.py; parses flags, calls aotc.api.explain, prints the report.
"""

from __future__ import annotations

import json

import click

from aotc.cli.types import exit_codes_epilog, model_options
from aotc.errors import ExportError


@click.command(epilog=exit_codes_epilog())
@model_options
@click.option(
    "--strict",
    is_flag=True,
    help="Judge the mode `aotc export --strict` uses (default: non-strict).",
)
@click.option(
    "--graph",
    "show_graphs",
    is_flag=True,
    help="Print each captured FX graph as a table (opcode, name, target, args).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def explain(model, input_shapes, dims, dtypes, entry, weights, strict, show_graphs, as_json):
    """Explain how MODEL traces: TorchDynamo graph breaks and torch.export problems, each with a fix.

    Takes the same model flags as `aotc export` and writes nothing. Exits 0 when `aotc export` with
    the same flags would succeed, 4 when it would not.
    """
    from aotc.api import explain as explain_api
    from aotc.explain.render import render_report
    from aotc.explain.report import ExplainConfig

    cfg = ExplainConfig(
        model=model,
        input_shapes=tuple(input_shapes),
        dims=tuple(dims),
        dtypes=tuple(dtypes),
        entry=entry,
        weights=weights,
        strict=strict,
    )
    report = explain_api(cfg)
    click.echo(
        json.dumps(report.to_dict(), indent=2) if as_json else render_report(report, show_graphs)
    )
    if not report.exportable:
        count = len(report.attempts[report.mode].problems)
        raise ExportError(
            f"torch.export ({report.mode}) cannot capture {report.model}: {count} problem(s), each "
            "with a fix in the report"
        )
