"""`aotc verify`: re-check a package (aotc.api.verify); one line per check, exit code of the first failure."""

from __future__ import annotations

import json
from pathlib import Path

import click

from aotc.cli.keys import required_key, signature_options
from aotc.cli.types import exit_codes_epilog


@click.command(epilog=exit_codes_epilog())
@click.argument("package", type=click.Path(path_type=Path))
@signature_options
@click.option(
    "--artifact",
    type=click.Path(path_type=Path),
    default=None,
    help="The export artifact (.pt2) the package was built from [default: the path its manifest records].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(package, require_signature, public_key, artifact, as_json):
    """Re-check PACKAGE: manifest, every file's sha256, torch/platform/GPU, signature, loading, numerics.

    \b
    The numeric check is the build's, run again: the package against its export artifact (its
    sha256 must be the one the manifest records) run eagerly, within the recorded tolerance.
    """
    from aotc.api import verify as verify_api
    from aotc.deploy.verify_package import VerificationFailed

    report = verify_api(package, required_key(require_signature, public_key), artifact)
    click.echo(json.dumps(report, indent=2) if as_json else format_report(report))
    if not report["ok"]:
        raise VerificationFailed.of(report)


def format_report(report: dict) -> str:
    lines = [f"{c['status']:<8} {c['name']:<14} {c['detail']}" for c in report["checks"]]
    numeric = report["numeric_check"]
    for out in numeric["outputs"] if numeric else ():
        lines.append(
            f"{'':<23} {out['name']}: max abs {out['max_abs']:.3g} (build {_figure(out['recorded_max_abs'])}), "
            f"max rel {out['max_rel']:.3g} (build {_figure(out['recorded_max_rel'])}), atol {out['atol']:g} "
            f"rtol {out['rtol']:g} {'ok' if out['ok'] else 'MISMATCH'}"
        )
    if report["ok"]:
        passed = sum(c["status"] == "ok" for c in report["checks"])
        lines.append(f"verified {report['package']}: {passed} check(s) passed")
    return "\n".join(lines)


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
