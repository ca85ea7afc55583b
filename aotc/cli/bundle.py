"""`aotc bundle`: a package, the C++ runner and their libraries in one folder for machines with no Python."""

from __future__ import annotations

import json
from pathlib import Path

import click

from aotc.cli.keys import required_key, signature_options
from aotc.cli.types import exit_codes_epilog


@click.command(epilog=exit_codes_epilog())
@click.argument("package", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Bundle folder to write [default: <package>_bundle/ beside the package].",
)
@click.option("--force", is_flag=True, help="Replace an existing bundle.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@signature_options
def bundle(package, output, force, as_json, require_signature, public_key):
    """Copy PACKAGE, the C++ runner (`make runner`) and the libraries they need into one folder.

    \b
    On the serving machine, with no Python:  BUNDLE/run --input x.npy --output y.npz
    (a text-generation package: BUNDLE/run --generate --prompt-ids 5,17,42).
    With --public-key the bundle carries the key and always checks the signature (`aotc sign`):
    an unsigned or altered package is refused there (exit 7).
    """
    from aotc.api import bundle as bundle_api

    public_key = required_key(require_signature, public_key)
    if output is None:
        output = package.resolve().parent / f"{package.resolve().name}_bundle"
    result = bundle_api(package, output, force, public_key=public_key)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(
        f"bundled {package} -> {result.output}: {result.size_bytes / 1e6:.0f} MB, {len(result.libraries)} libraries"
    )
    if result.requires_signature:
        click.echo("its launcher refuses the package unless it is signed by that public key")
    click.echo(f"run it: {result.command}")
