"""`aotc keygen` and `aotc sign`: ed25519 keys, and a package's signature (manifest.json.sig).

The `--require-signature` / `--public-key` pair that `aotc run`, `aotc verify` and `aotc serve`
share lives with the serve command in the runtime (aotc_runtime/serve/cli_options.py).
"""

from __future__ import annotations

from pathlib import Path

import click

from aotc.cli.types import exit_codes_epilog
from aotc_runtime.serve.cli_options import required_key as required_key
from aotc_runtime.serve.cli_options import signature_options as signature_options


@click.command(epilog=exit_codes_epilog())
@click.option(
    "--private-key",
    "private_key",
    type=click.Path(path_type=Path),
    required=True,
    help="Where to write the private key (PEM PKCS8, unencrypted, mode 600): keep it secret.",
)
@click.option(
    "--public-key",
    "public_key",
    type=click.Path(path_type=Path),
    required=True,
    help="Where to write the public key (PEM), for `--public-key` of run and verify.",
)
@click.option("--force", is_flag=True, help="Replace existing key files.")
def keygen(private_key, public_key, force):
    """Make an ed25519 key pair to sign packages with (`aotc sign`)."""
    from aotc.errors import UserInputError
    from aotc_runtime import generate_keypair

    try:
        generate_keypair(private_key, public_key, force=force)
    except FileExistsError as exc:
        raise UserInputError(
            f"{exc.filename} already exists; pass --force to replace it, or choose another path"
        ) from None
    except ValueError as exc:
        raise UserInputError(
            f"{exc}; give --private-key and --public-key different paths"
        ) from None
    click.echo(f"wrote private key {private_key} (keep it secret) and public key {public_key}")
    click.echo(f"sign a package: aotc sign PKG --key {private_key}")


@click.command(epilog=exit_codes_epilog())
@click.argument("package", type=click.Path(path_type=Path))
@click.option(
    "--key",
    "private_key",
    type=click.Path(path_type=Path),
    required=True,
    help="The private key (PEM) from `aotc keygen`.",
)
def sign(package, private_key):
    """Sign PACKAGE: an ed25519 signature over its manifest.json, which holds every file's sha256.

    \b
    The package is checked first (manifest, every file's hash); a damaged one is refused.
    Check it where it runs: aotc run PKG --require-signature --public-key KEY.pub.pem
    """
    from aotc_runtime import sign_package

    written = sign_package(package, private_key)
    click.echo(f"signed {package}: {written}")
    click.echo(f"check it: aotc verify {package} --require-signature --public-key PUBLIC_KEY.pem")
