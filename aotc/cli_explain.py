"""`aotc explain`: why a model does or does not export, in terms of the user's code. Writes nothing.

Registered on the `aotc` group from cli.py; parses flags, calls aotc.api.explain, prints the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .cli_types import dim_type, exit_codes_epilog, shape_type
from .errors import ExportError


@click.command(epilog=exit_codes_epilog())
@click.argument("model")
@click.option("--input-shape", "input_shapes", type=shape_type(), multiple=True, help="Shape of one positional input, e.g. 16x3x128x128 or Bx128; repeat per input.")
@click.option("--dim", "dims", type=dim_type(), multiple=True, help="Range of a named dim: B=1:64 or B=1:64:16 (as for `aotc export`).")
@click.option("--dtype", "dtypes", multiple=True, help="Input dtype: one for all or one per input.")
@click.option("--entry", help="Name of the model class, factory, instance or function in the file.")
@click.option("--weights", type=click.Path(path_type=Path), help="state_dict to load first.")
@click.option("--strict", is_flag=True, help="Judge the mode `aotc export --strict` uses (default: non-strict).")
@click.option("--graph", "show_graphs", is_flag=True, help="Print each captured FX graph as a table (opcode, name, target, args).")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def explain(model, input_shapes, dims, dtypes, entry, weights, strict, show_graphs, as_json):
    """Explain how MODEL traces: TorchDynamo graph breaks and torch.export problems, each with a fix.

    Takes the same model flags as `aotc export` and writes nothing. Exits 0 when `aotc export` with
    the same flags would succeed, 4 when it would not.
    """
    from .api import explain as explain_api
    from .explain import ExplainConfig
    from .explain_render import render_report

    cfg = ExplainConfig(model=model, input_shapes=tuple(input_shapes), dims=tuple(dims), dtypes=tuple(dtypes),
                        entry=entry, weights=weights, strict=strict)
    report = explain_api(cfg)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else render_report(report, show_graphs))
    if not report.exportable:
        count = len(report.attempts[report.mode].problems)
        raise ExportError(f"torch.export ({report.mode}) cannot capture {report.model}: {count} problem(s), each with a fix in the report")
