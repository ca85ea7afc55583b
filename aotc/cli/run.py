"""`aotc run`: a package through the thin runtime (aotc.api.run); prints outputs and latency."""

from __future__ import annotations

import json
from pathlib import Path

import click

from aotc.cli.keys import required_key, signature_options
from aotc.cli.types import exit_codes_epilog


@click.command(epilog=exit_codes_epilog())
@click.argument("package", type=click.Path(path_type=Path))
@click.option(
    "--input",
    "inputs",
    multiple=True,
    type=click.Path(path_type=Path),
    help=".npy, .npz or .pt in positional order; default: seeded random inputs.",
)
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    help="Write outputs to .npz (output_0, ...) or .pt.",
)
@click.option(
    "--iters",
    type=click.IntRange(min=0),
    default=0,
    help="Timed calls after the first (median/p90/p99).",
)
@click.option("--seed", type=int, default=0, help="Seed of the random inputs.")
@click.option(
    "--threads",
    type=click.IntRange(min=1, max=256),
    default=1,
    show_default=True,
    help="Threads calling the package at once, each making --iters calls; reports throughput "
    "(CPU: each thread gets cores/N intra-op threads).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--engine",
    type=click.Choice(["python", "cpp"]),
    default="python",
    show_default=True,
    help="python: the aotc_runtime package; cpp: the C++ runner (`make runner`), to check both agree.",
)
@signature_options
def run(
    package, inputs, output, iters, seed, threads, as_json, engine, require_signature, public_key
):
    """Run PACKAGE through the thin runtime: no compile, no warm-up."""
    from aotc.api import run as run_api

    public_key = required_key(require_signature, public_key)
    if engine == "cpp":
        if threads > 1:
            raise click.UsageError(
                "--threads is for --engine python; the C++ runner calls from one thread"
            )
        raise click.exceptions.Exit(
            run_cpp(package, inputs, output, iters, seed, as_json, public_key)
        )
    from aotc_runtime import format_report

    report = run_api(package, inputs, output, iters, seed, public_key=public_key, threads=threads)
    click.echo(json.dumps(report, indent=2) if as_json else format_report(report))


def run_cpp(
    package: Path, inputs, output, iters: int, seed: int, as_json: bool, public_key=None
) -> int:
    """The same run through aotc-runner; its report and errors pass through, its exit code is ours."""
    import subprocess

    from aotc.deploy.cpp_runner import runner_path

    args = [str(runner_path()), str(package), "--iters", str(iters), "--seed", str(seed)]
    for path in inputs:
        args += ["--input", str(path)]
    if output is not None:
        args += ["--output", str(output)]
    if as_json:
        args.append("--json")
    if public_key is not None:  # the runner checks it as the Python runtime does
        args += ["--require-signature", "--public-key", str(public_key)]
    result = subprocess.run(args, capture_output=True, text=True)
    click.echo(result.stdout, nl=False)
    click.echo(result.stderr, nl=False, err=True)
    return result.returncode
