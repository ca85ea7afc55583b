"""One error hierarchy and one exit-code table for the whole CLI.

Every error message says what went wrong, where, and the flag or change that fixes it. The CLI
prints `error: <message>` on one line and exits with the class's code; the traceback only with
--verbose. Runtime errors and the table come from aotc_runtime so the runtime never imports aotc.
"""

from __future__ import annotations

# The exit-code table and serve's errors live with the runtime too: `aotc-serve` runs without aotc.
from aotc_runtime import (
    EXIT_CODES,
    INTERRUPTED_EXIT_CODE,
    AotcRuntimeError,
    InputMismatchError,
    OptionError,
    PackageError,
    ServeError,
)


class AotcError(Exception):
    exit_code = 1


class UserInputError(AotcError):
    """A flag, path or file the user gave is malformed or missing."""

    exit_code = 2


class DiskFullError(UserInputError):
    """A device the command writes to is full. When native code failed on it, objects torch still
    holds would abort the process as they are destroyed: the CLI leaves at once after reporting."""

    exit_code = 2
    leave_at_once = False  # set when such an error was raised after a native failure


class ModelError(AotcError):
    """The user's model cannot be loaded, constructed, or fails on its own example inputs."""

    exit_code = 3


class ExportError(AotcError):
    """torch.export cannot capture the model as one graph."""

    exit_code = 4


class BuildError(AotcError):
    """Lowering or compiling failed, or the compiled package crashed when loaded."""

    exit_code = 5


class NumericMismatchError(AotcError):
    """The compiled package disagrees with eager beyond the tolerance."""

    exit_code = 6


class InternalError(AotcError):
    """A bug in aotc itself; the message asks for --verbose and a report."""

    exit_code = 1


__all__ = [
    "AotcError",
    "UserInputError",
    "ModelError",
    "ExportError",
    "BuildError",
    "NumericMismatchError",
    "InternalError",
    "AotcRuntimeError",
    "PackageError",
    "InputMismatchError",
    "EXIT_CODES",
    "INTERRUPTED_EXIT_CODE",
    "ServeError",
    "OptionError",
]
