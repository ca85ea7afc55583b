"""The click pieces `aotc-serve` shares with aotc's commands: the exit-code table under --help,
--require-signature / --public-key, and the --threads type. Here, beside the serve command, so a
serving machine has them without aotc (click comes with the `serve` extra: Ray needs it); aotc's
CLI imports them from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from aotc_runtime.errors import EXIT_CODES, OptionError


def exit_codes_epilog() -> str:
    """The exit-code table under every command's --help (the same rows as README's table)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES)


def signature_options(command: Any) -> Any:
    """--require-signature and --public-key, as `aotc run`, `aotc verify` and `aotc serve` take them."""
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


class ThreadsType(click.ParamType):
    """`--threads N`, the CPU threads of a package's calls: a bad value is the one line of
    aotc_runtime.threads.parse_threads (exit 2), not click's usage block."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from aotc_runtime.threads import parse_threads

        try:
            return parse_threads(value)
        except ValueError as exc:
            raise OptionError(str(exc)) from None
