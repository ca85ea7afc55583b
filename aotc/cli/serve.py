"""`aotc serve`: the runtime's serve command (aotc_runtime/serve/command.py, also `aotc-serve` on a
machine with only the runtime), registered unchanged in aotc's group."""

from __future__ import annotations

from aotc_runtime.serve.command import serve as serve
