"""One ptxas for a whole CUDA build: the one Inductor's compile workers use.

Why: Triton's on-disk kernel cache is keyed on, among other things, the version of the ptxas that
assembles the kernel. Inductor's compile workers point Triton at the ptxas bundled with torch
(torch 2.11+cu130: torch/bin/ptxas, CUDA 13.0) through $TRITON_PTXAS_PATH, but the build process
itself does so only on a path a large model never takes, and keeps Triton's own ptxas (CUDA 12.8).
For max-autotune the workers precompile every template choice so that benchmarking only loads it;
with two ptxas versions those precompiles land under keys the build process never looks up, and it
compiles each choice again, on one core, while the GPU waits. Measured on the H100 for densenet121
(docs/benchmarks.md): 38 s of benchmarking per conv before, 0.5 s with one ptxas; the Triton cache
held PTX of two versions (461 of 8.7, 1302 of 9.0). Nothing is tuned differently: the same choices
are compiled and benchmarked, each once.

The workers' choice comes from torch's own `_set_triton_ptxas_path` (where the bundled ptxas lives
moved between releases), called with the environment restored afterwards. A $TRITON_PTXAS_PATH the
user set wins: the workers inherit it too.
"""

from __future__ import annotations

import contextlib
import os
import warnings

from aotc.env_vars import env_set

ENV = "TRITON_PTXAS_PATH"


def workers_ptxas() -> str | None:
    """The ptxas Inductor's compile workers give Triton; None where they leave Triton's own."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    try:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path
    except ImportError:  # a torch without the hook: its workers do not choose either
        return None
    choose = getattr(
        _set_triton_ptxas_path, "__wrapped__", _set_triton_ptxas_path
    )  # it is cached per process
    with (
        env_set(**{ENV: None}),
        warnings.catch_warnings(),
    ):  # it sets the variable: read it, then undo
        warnings.simplefilter(
            "ignore"
        )  # "exists but is not an executable": then there is nothing to align
        choose()
        return os.environ.get(ENV)


@contextlib.contextmanager
def same_ptxas_as_workers(enabled: bool = True):
    """Give this process the workers' ptxas for the duration; yields its path (None: Triton's own)."""
    if not enabled or os.environ.get(ENV):
        yield os.environ.get(ENV)
        return
    path = workers_ptxas()
    with env_set(**{ENV: path}):
        yield path
