"""Environment variables set for a block and put back after (the one way aotc changes os.environ).

Compile workers and child processes read their settings from the environment ($CXX, ptxas, the
Inductor cache); a library must not leave them changed in its caller's process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def env_set(**values: str | None) -> Iterator[None]:
    """Set each variable (None: remove it) for the block; restore every one afterwards."""
    old = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
