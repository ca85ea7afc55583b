"""aotc_runtime: run packages built by `aotc build` with nothing but torch installed.

    import aotc_runtime
    pkg = aotc_runtime.load("mlp_pkg/")
    y = pkg(x)

The names in __all__ are the public API, for users and for aotc itself (the compiler side reads and
writes packages only through them); submodules are internal. torch is imported on first use of a
name that needs it, so importing the errors (as `aotc --help` does) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    EXIT_CODES,
    INTERRUPTED_EXIT_CODE,
    AotcRuntimeError,
    GenerationBusyError,
    GenerationInputError,
    InputMismatchError,
    InputTooLargeError,
    MissingDependencyError,
    NonFiniteLogitsError,
    OptionError,
    PackageError,
    ServeError,
)

__version__ = "0.1.0"

# public name -> the submodule that defines it
_LAZY = {
    # loading and calling a package
    "load": "package",
    "Package": "package",
    # the package format (docs/package-format.md)
    "Manifest": "manifest",
    "Source": "manifest",
    "Toolchain": "manifest",
    "Device": "manifest",
    "RuntimeSettings": "manifest",
    "NumericCheck": "manifest",
    "OutputCheck": "manifest",
    "Specialization": "manifest",
    "Generation": "generation_record",
    "SharedWeights": "manifest",
    "read_manifest": "manifest",
    "verify_files": "manifest",
    "check_finished": "manifest",
    "hash_package_files": "manifest",
    "sha256_file": "manifest",
    "FORMAT_VERSION": "manifest",
    "READABLE_VERSIONS": "manifest",
    "MANIFEST_NAME": "manifest",
    "MODEL_FILE": "manifest",
    "STATE_FILE": "manifest",
    "SIGNATURE_FILE": "manifest",
    "HASH_FIELD": "manifest",
    "CONTRACT_KEY": "manifest",
    "manifest_text": "manifest",
    "hashed_manifest_text": "manifest",
    "model_contract": "manifest",
    "FieldError": "fields",
    # what a tokenizer.json may do to the text it rewrites (checked at export and at load)
    "tokenizer_growth_problem": "tokenizer_bounds",
    "Signature": "signature",
    "TensorSpec": "signature",
    "DTYPES": "signature",
    "DTYPE_NAMES": "signature",
    "random_tensor": "signature",
    # the machine a package is built for and runs on
    "running_environment": "environment",
    "gpu_description": "environment",
    "cpu_features": "environment",
    "check_compatible": "environment",
    # signing a package and checking its signature (ed25519; needs cryptography)
    "verify_signature": "signing",
    "sign_package": "signing",
    "generate_keypair": "signing",
    # running, inputs and outputs, timing
    "run_package": "runner",
    "format_report": "runner",
    "read_inputs": "tensor_io",
    "read_npz": "npz",
    "write_outputs": "tensor_io",
    "flatten_outputs": "tensor_io",
    "run_concurrently": "concurrency",
    "intra_op_threads": "concurrency",
    "time_calls": "timing",
    "summarize": "timing",
    "synchronize": "timing",
    "replaced_atomically": "files",
    "write_text_atomically": "files",
}

__all__ = [
    "AotcRuntimeError",
    "GenerationInputError",
    "GenerationBusyError",
    "NonFiniteLogitsError",
    "PackageError",
    "InputMismatchError",
    "InputTooLargeError",
    "MissingDependencyError",
    "OptionError",
    "ServeError",
    "EXIT_CODES",
    "INTERRUPTED_EXIT_CODE",
    "__version__",
    "load",
    "Package",
    "Manifest",
    "Generation",
    "Source",
    "Toolchain",
    "Device",
    "RuntimeSettings",
    "NumericCheck",
    "OutputCheck",
    "Specialization",
    "SharedWeights",
    "read_manifest",
    "verify_files",
    "check_finished",
    "hash_package_files",
    "sha256_file",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "MANIFEST_NAME",
    "MODEL_FILE",
    "STATE_FILE",
    "SIGNATURE_FILE",
    "HASH_FIELD",
    "CONTRACT_KEY",
    "manifest_text",
    "hashed_manifest_text",
    "model_contract",
    "FieldError",
    "tokenizer_growth_problem",
    "Signature",
    "TensorSpec",
    "DTYPES",
    "DTYPE_NAMES",
    "random_tensor",
    "running_environment",
    "gpu_description",
    "cpu_features",
    "check_compatible",
    "verify_signature",
    "sign_package",
    "generate_keypair",
    "run_package",
    "format_report",
    "read_inputs",
    "read_npz",
    "write_outputs",
    "flatten_outputs",
    "run_concurrently",
    "intra_op_threads",
    "time_calls",
    "summarize",
    "synchronize",
    "replaced_atomically",
    "write_text_atomically",
]

if TYPE_CHECKING:
    from .concurrency import intra_op_threads, run_concurrently
    from .environment import (
        check_compatible,
        cpu_features,
        gpu_description,
        running_environment,
    )
    from .fields import FieldError
    from .files import replaced_atomically, write_text_atomically
    from .generation_record import Generation
    from .manifest import (
        CONTRACT_KEY,
        FORMAT_VERSION,
        HASH_FIELD,
        MANIFEST_NAME,
        MODEL_FILE,
        READABLE_VERSIONS,
        SIGNATURE_FILE,
        STATE_FILE,
        Device,
        Manifest,
        NumericCheck,
        OutputCheck,
        RuntimeSettings,
        SharedWeights,
        Source,
        Specialization,
        Toolchain,
        check_finished,
        hash_package_files,
        hashed_manifest_text,
        manifest_text,
        model_contract,
        read_manifest,
        sha256_file,
        verify_files,
    )
    from .npz import read_npz
    from .package import Package, load
    from .runner import format_report, run_package
    from .signature import DTYPE_NAMES, DTYPES, Signature, TensorSpec, random_tensor
    from .signing import generate_keypair, sign_package, verify_signature
    from .tensor_io import flatten_outputs, read_inputs, write_outputs
    from .timing import summarize, synchronize, time_calls


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aotc_runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
