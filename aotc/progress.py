"""Progress on stderr: each stage with its elapsed time, and a heartbeat while a long step runs."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable


class Progress:
    def __init__(self, enabled: bool = True, stream=None, heartbeat_s: float = 15.0):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.heartbeat_s = heartbeat_s
        self.started = time.perf_counter()

    def _say(self, text: str) -> None:
        if self.enabled:
            print(f"[aotc {time.perf_counter() - self.started:6.1f}s] {text}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        self._say(text)

    @contextlib.contextmanager
    def stage(self, name: str, detail: Callable[[], str] | None = None):
        """Announce a stage, keep saying it is alive, and report how long it took.

        `detail`, when given, is asked at each heartbeat for a few words on how far the stage got
        (a max-autotune build runs for an hour; "still working" alone says nothing).
        """
        self._say(f"{name} ...")
        began = time.perf_counter()
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(name, began, stop, detail), daemon=True)
        if self.enabled:
            beat.start()
        try:
            yield
        finally:
            stop.set()
        self._say(f"{name}: done in {time.perf_counter() - began:.1f}s")

    def _heartbeat(self, name: str, began: float, stop: threading.Event, detail) -> None:
        while not stop.wait(self.heartbeat_s):
            extra = detail() if detail else ""
            self._say(f"{name}: still working ({time.perf_counter() - began:.0f}s{', ' + extra if extra else ''})")
