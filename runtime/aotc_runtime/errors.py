"""Errors the runtime raises. Each carries the process exit code the CLIs use for it.

The compiler side (aotc.errors) re-uses these classes and the exit-code table below, so both halves
(aotc, aotc-run, aotc-serve) share one table without the runtime ever importing aotc.
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


class OptionError(AotcRuntimeError):
    """A flag of a runtime command (aotc-serve, aotc serve) is malformed or cannot be met here: a
    busy port, more GPUs than the machine has. Exit 2, as aotc's UserInputError."""

    exit_code = 2


class ServeError(AotcRuntimeError):
    """`aotc serve` could not start: Ray would not start or join its cluster, or no replica came up."""

    exit_code = 9


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


INTERRUPTED_EXIT_CODE = 130

# The documented table (README, `aotc --help` and `aotc-serve --help` are generated from the same rows).
EXIT_CODES = (
    (0, "success"),
    (1, "internal error in aotc (a bug: rerun with --verbose and report it)"),
    (2, "bad command line or input file (flags, shapes, paths, configs)"),
    (3, "the model cannot be loaded, constructed, or fails on its example inputs"),
    (4, "torch.export cannot capture the model (see `aotc explain`)"),
    (5, "build failed: compilation error, or the package crashed when loaded"),
    (6, "numeric check failed: package output differs from eager beyond tolerance"),
    (7, "package refused: not a package, damaged, or built for another torch/GPU"),
    (8, "run-time inputs do not match the package signature"),
    (9, "aotc serve could not start: Ray, its cluster, or no replica answered"),
    (130, "interrupted (Ctrl-C or SIGTERM); nothing half-written is left"),
)
