"""Errors the runtime raises. Each carries the process exit code the CLIs use for it.

The compiler side (aotc.errors) re-uses these classes so both halves share one exit-code table
without the runtime ever importing aotc.
"""


class AotcRuntimeError(Exception):
    """Base of every error the runtime raises on purpose (never for our own bugs)."""

    exit_code = 7


class PackageError(AotcRuntimeError):
    """The package folder is missing, incomplete, edited, or built for something else."""

    exit_code = 7


class InputMismatchError(AotcRuntimeError):
    """Inputs given at run time do not match the package's signature."""

    exit_code = 8


class MissingDependencyError(AotcRuntimeError):
    """An optional library a feature needs (cryptography, for package signing) is not installed."""

    exit_code = 2


class InputTooLargeError(InputMismatchError):
    """Inputs that declare more bytes than the reader was allowed (serve: HTTP 413)."""

    def __init__(self, message: str, size: int, limit: int):
        super().__init__(message)
        self.size, self.limit = size, limit


class GenerationInputError(AotcRuntimeError):
    """A generation request the package cannot serve: an empty prompt, ids outside the
    vocabulary, more prompts than the package's batch, or more tokens than its KV cache holds."""

    exit_code = 2


class GenerationBusyError(GenerationInputError):
    """A call that would move a package's KV cache while one of its generations is open and
    paused: a stream nobody reads, or one open in the calling thread itself."""


class NonFiniteLogitsError(AotcRuntimeError):
    """The package's logits for a sequence were not finite (NaN or infinite): its weights, its
    dtype's range or its inputs; the sequence ends, the others go on. Exit 3, as a model that
    fails on its inputs."""

    exit_code = 3
