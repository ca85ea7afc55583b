"""Progress on stderr, the one interface of build and bench.

Progress: each stage with its elapsed time, and a heartbeat while a long step runs (`aotc build`):
on a terminal one line redrawn in place, elsewhere (CI logs, pipes) a line at intervals that
double, so a 20-minute check writes 7 lines, not 80.
ProgressBar: the same, plus one bar over a plan of weighted steps (`aotc bench`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable

MAX_HEARTBEAT_S = 300.0  # the longest wait between two heartbeat lines off a terminal


class Progress:
    def __init__(self, enabled: bool = True, stream=None, heartbeat_s: float = 15.0):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.heartbeat_s = heartbeat_s
        self.redraws = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}  # stage key -> seconds, for stages given a key

    def _say(self, text: str) -> None:
        if self.enabled:
            print(
                f"[aotc {time.perf_counter() - self.started:6.1f}s] {text}",
                file=self.stream,
                flush=True,
            )

    def note(self, text: str) -> None:
        self._say(text)

    def warn(self, text: str) -> None:
        """One line on stderr that --quiet does not silence: something the user should know."""
        print(f"warning: {text}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def stage(self, name: str, detail: Callable[[], str] | None = None, key: str = ""):
        """Announce a stage, keep saying it is alive, and report how long it took.

        `detail`, when given, is asked at each heartbeat for a few words on how far the stage got
        (a max-autotune build runs for an hour; "still working" alone says nothing). `key`, when
        given, keeps the stage's time in `seconds[key]` (a build's breakdown).
        """
        self._say(f"{name} ...")
        began = time.perf_counter()
        stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(name, began, stop, detail), daemon=True
        )
        if self.enabled:
            beat.start()
        try:
            yield
        finally:
            stop.set()
            if beat.is_alive():
                beat.join()
            if key:
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - began
        self._say(f"{name}: done in {time.perf_counter() - began:.1f}s")

    def _heartbeat(self, name: str, began: float, stop: threading.Event, detail) -> None:
        wait, drawn = self.heartbeat_s, False
        while not stop.wait(wait):
            extra = detail() if detail else ""
            line = f"{name}: still working ({time.perf_counter() - began:.0f}s{', ' + extra if extra else ''})"
            if self.redraws:  # the next line (the stage's end, or a note) is drawn over it
                elapsed = time.perf_counter() - self.started
                self.stream.write(f"\r\x1b[K[aotc {elapsed:6.1f}s] {line}")
                self.stream.flush()
                drawn = True
            else:
                self._say(line)
                wait = min(2 * wait, MAX_HEARTBEAT_S)
        if drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


class ProgressBar(Progress):
    """One bar over the whole plan on stderr: redrawn in place on a terminal, a line now and then elsewhere."""

    def __init__(self, enabled: bool = True, stream=None, width: int = 28):
        super().__init__(enabled, stream)
        self.width = width
        self.total, self.done, self.last_line = 1.0, 0.0, 0.0
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.redraws = False  # its heartbeat goes through _say, which redraws the bar itself

    def begin(self, total: float) -> None:
        """`total`: the plan's weight, the sum of its steps' weights (rough relative costs)."""
        self.total, self.done, self.started = max(1, total), 0, time.perf_counter()

    def step(self, label: str, weight: float = 1) -> None:
        """Announce the next step of the plan (the previous one is done)."""
        self._draw(label, final=False)
        self.done = min(self.done + weight, self.total)

    def _say(self, text: str) -> None:  # notes and stages draw on the bar
        self._draw(text, final=False, counted=False)

    def finish(self) -> None:
        self.done = self.total
        self._draw(f"done in {time.perf_counter() - self.started:.1f}s", final=True)

    def _draw(self, label: str, final: bool, counted: bool = True) -> None:
        if not self.enabled:
            return
        filled = round(self.width * self.done / self.total)
        line = (
            f"[aotc bench] {'#' * filled}{'.' * (self.width - filled)} {100 * self.done / self.total:3.0f}% "
            f"{time.perf_counter() - self.started:6.1f}s  {label}"
        )
        if self.tty:
            columns = 120
            with contextlib.suppress(OSError):
                columns = os.get_terminal_size(self.stream.fileno()).columns
            self.stream.write("\r\x1b[K" + line[: columns - 1] + ("\n" if final else ""))
            self.stream.flush()
            return
        # Not a terminal (CI logs, pipes): the slow steps and a heartbeat, not one line per timed slice.
        now = time.perf_counter()
        if final or not counted or "timed round" not in label or now - self.last_line > 5:
            print(line, file=self.stream, flush=True)
            self.last_line = now
