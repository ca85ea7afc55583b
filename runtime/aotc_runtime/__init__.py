"""aotc_runtime: run packages built by `aotc build` with nothing but torch installed.

    import aotc_runtime
    pkg = aotc_runtime.load("mlp_pkg/")
    y = pkg(x)
"""

from .errors import AotcRuntimeError, InputMismatchError, PackageError

__version__ = "0.1.0"
__all__ = ["load", "Package", "AotcRuntimeError", "PackageError", "InputMismatchError", "FORMAT_VERSION", "__version__"]


def __getattr__(name):
    # torch is imported on first use, so that `aotc --help` (which imports the errors) stays fast.
    if name in ("load", "Package"):
        from . import package

        return getattr(package, name)
    if name == "FORMAT_VERSION":
        from .manifest import FORMAT_VERSION

        return FORMAT_VERSION
    raise AttributeError(f"module 'aotc_runtime' has no attribute {name!r}")
