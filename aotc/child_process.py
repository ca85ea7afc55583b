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


def failure_line(stderr: str, returncode: int) -> str:
    """The line of a failed child's stderr that says what went wrong.

    A C++ exception ends with its native frames ("frame #35: _start ..."): the message is the last
    line that names an error, not the last line.
    """
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [
        line
        for line in lines
        if re.match(r"[\w.]*(Error|Exception)\b", line)
        and not line.startswith("Exception raised from")
    ]
    return (errors[-1] if errors else lines[-1] if lines else f"exit status {returncode}")[:300]
