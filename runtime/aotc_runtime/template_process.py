"""A chat template's own process, seen from the process that asks for prompts (the worker's side,
and why a process, are in template_worker.py).

    worker = TemplateProcess(text)          # starts the process and compiles; TemplateFailure if not
    prompt = worker.render(variables)       # TemplateFailure(kind, message) for what went wrong
    worker.close()

A compile or a render that passes MAX_SECONDS is killed (kind "stopped"); so is a worker whose
reply would pass MAX_REPLY_BYTES. The next render starts a new worker and compiles again, so one
stopped render costs its caller, not the ones after it. Renders are taken one at a time (a lock):
callers in other threads wait for the one before, each with its own deadline.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .template_sandbox import MAX_TEXT
from .template_worker import HEADER_BYTES, write_message

MAX_SECONDS = 5.0  # a compile, and a render; real chat templates take milliseconds for either
MAX_REPLY_BYTES = 4 * MAX_TEXT + (1 << 16)  # the longest prompt in UTF-8, and JSON's quoting
_RUNTIME_ROOT = str(Path(__file__).resolve().parent.parent)  # the folder aotc_runtime is in


class TemplateFailure(Exception):
    """A compile or render that failed: `kind` is "syntax", "stopped", "refused" or "failed"
    (template_worker.py), `message` one line."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


class TemplateProcess:
    def __init__(self, text: str):
        self._text = text
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        with self._lock:
            self._start()

    def render(self, variables: dict[str, Any]) -> str:
        """The template rendered with `variables` (JSON values), in its process."""
        with self._lock:
            if self._process is not None and self._process.poll() is not None:
                self._stop()  # it ended between renders (killed from outside): start another
            if self._process is None:
                self._start()
            return self._ask({"variables": variables}, "the render")["text"]

    def close(self) -> None:
        with self._lock:
            self._stop()

    def __del__(self) -> None:
        if getattr(self, "_process", None) is not None:
            self._stop()

    def _start(self) -> None:
        # the worker imports aotc_runtime from where this one was imported, whatever the path
        code = (
            f"import sys; sys.path.insert(0, {_RUNTIME_ROOT!r}); "
            "from aotc_runtime.template_worker import main; main()"
        )
        self._process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the parent, which stops it
        )
        self._ask({"template": self._text}, "compiling it")

    def pid(self) -> int | None:
        """The worker's process id (None: none runs now)."""
        return self._process.pid if self._process is not None else None

    def _ask(self, request: dict, what: str) -> dict:
        process = self._process
        assert process is not None and process.stdin is not None
        deadline = time.monotonic() + MAX_SECONDS
        try:
            write_message(process.stdin, {**request, "seconds": MAX_SECONDS})
            size = int.from_bytes(self._read(HEADER_BYTES, deadline, what), "big")
            if size > MAX_REPLY_BYTES:
                self._stop()
                raise TemplateFailure(
                    "stopped", f"{what} made a reply of {size:,} bytes, above {MAX_REPLY_BYTES:,}"
                )
            reply = json.loads(self._read(size, deadline, what))
        except BrokenPipeError:
            reply = {"kind": "stopped", "message": self._ended(what)}
        if "kind" in reply:
            if reply["kind"] == "stopped" or "template" in request:
                self._stop()  # a worker past a bound may hold what it built: start afresh
            raise TemplateFailure(reply["kind"], reply["message"])
        return reply

    def _read(self, count: int, deadline: float, what: str) -> bytes:
        process = self._process
        assert process is not None and process.stdout is not None
        fd = process.stdout.fileno()
        chunks, left = [], count
        while left:
            remaining = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(remaining, 0))[0] if remaining > 0 else []
            if not ready:
                self._stop()
                raise TemplateFailure("stopped", f"{what} ran past {MAX_SECONDS:g} s")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise TemplateFailure("stopped", self._ended(what))
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _ended(self, what: str) -> str:
        """Why the worker left mid-answer (out of its address space, or its stack)."""
        process = self._process
        try:
            code = process.wait(timeout=MAX_SECONDS) if process is not None else None
        except subprocess.TimeoutExpired:
            code = None
        self._stop()
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
            return f"{what} ended its process (signal {name}), beyond its memory or stack"
        return f"{what} ended its process (exit {code}), beyond its memory or stack"

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()
