"""`aotc keygen` and `aotc sign`: ed25519 keys, and a package's signature (manifest.json.sig).

Also the `--require-signature` / `--public-key` pair that `aotc run` and `aotc verify` share.
"""

from __future__ import annotations

from pathlib import Path

import click

from aotc.cli.types import exit_codes_epilog


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


def signature_options(command):
    """--require-signature and --public-key, as `aotc run` and `aotc verify` take them."""
    command = click.option(
        "--public-key",
        "public_key",
        type=click.Path(path_type=Path),
        default=None,
        help="ed25519 public key (PEM, `aotc keygen`); the package must be signed by its private key.",
    )(command)
    return click.option(
        "--require-signature",
        is_flag=True,
        help="Refuse the package unless it is signed (`aotc sign`) by --public-key's private key.",
    )(command)


def required_key(require_signature: bool, public_key: Path | None) -> Path | None:
    """The key a package must be signed with, or None: --public-key alone asks for the check too."""
    if require_signature and public_key is None:
        raise click.UsageError(
            "--require-signature needs --public-key PEM: the public key the package must be signed with"
        )
    return public_key
