"""Child processes aotc starts (the build's numeric check, bench's cold starts): modules run with
`python -m`, the same environment, one time limit, one way to read why a child failed."""

from __future__ import annotations

import os
import re
import sys

# a max-autotune torch.compile cold start on a large model takes many minutes
CHILD_TIMEOUT_S = 1800


def child_command(module: str, *args: str) -> list:
    return [sys.executable, "-m", module, *args]


def child_env(**extra: str) -> dict:
    """This process's environment, with its sys.path (aotc may run from a checkout) and `extra`."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **extra}


# Lines that say a native failure happened but not which: AOTInductor wraps every error of a
# model's run in "run_func_(...) API call failed at .../model_container_runner.cpp", and prints the
# cause ("Error: ...", a CUDA error, a failed assertion) on the lines above it.
_WRAPPERS = re.compile(r"API call failed at|^Exception raised from")
# glog's prefix on torch's C++ log lines: "[E1123 18:22:10.655812392 c_shim_cuda.cpp:1273] "
_GLOG_PREFIX = re.compile(r"^\[[EWIF]\d{4} [\d:.]+ [^\]]+\] ")
_CAUSES = re.compile(
    # assert(ion) as a word: torch's frames and log lines mention `_assert_tensor_metadata` and
    # friends, which say nothing of the failure
    r"^[\w.]*(Error|Exception)\b|Exception in aoti_torch|CUDA error|out of memory|\bassert(ion)?\b"
    r"|what\(\):",
    re.IGNORECASE,
)


def failure_line(stderr: str, returncode: int) -> str:
    """The line of a failed child's stderr that says what went wrong.

    A C++ exception ends with its native frames ("frame #35: _start ..."), and AOTInductor's
    runner ends with a generic "API call failed" line: the message is the last line that names a
    cause, not the last line, and not the wrapper when a cause precedes it.
    """
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    lines = [_GLOG_PREFIX.sub("", line) for line in lines if not line.startswith("frame #")]
    errors = [line for line in lines if _CAUSES.search(line)]
    causes = [line for line in errors if not _WRAPPERS.search(line)]
    picked = causes or errors or lines[-1:]
    return (picked[-1] if picked else f"exit status {returncode}")[:300]
