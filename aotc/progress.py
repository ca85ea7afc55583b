"""Progress on stderr, the one interface of build and bench.

Progress: each stage with its elapsed time, its step in the run's plan and an estimate of the time
left (aotc/stage_estimates.py), and a heartbeat while a long step runs (`aotc export`, `aotc build`):
on a terminal one line redrawn in place for the whole run, notes printed above it; elsewhere (CI
logs, pipes) a line per stage and heartbeats at intervals that double, so a 20-minute check writes
7 lines, not 80.
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
        # the run's keyed stages in order, each with its estimate in seconds (None: not known yet)
        self.plan: dict[str, float | None] = {}
        self._line = ""  # on a terminal: the stage line drawn in place (no newline after it)
        self._running = False  # whether a stage is running (its line is redrawn under notes)
        self._lock = threading.Lock()

    def set_plan(self, estimates: dict[str, float | None]) -> None:
        """The run's keyed stages in order with their estimates (aotc/stage_estimates.py): each
        stage's line then says which step of how many it is and about how long the run has left.
        Called again as estimates become known (a build knows its program's size once loaded)."""
        self.plan = dict(estimates)

    def _stamp(self, text: str) -> str:
        return f"[aotc {time.perf_counter() - self.started:6.1f}s] {text}"

    def _say(self, text: str) -> None:
        """A line that stays (a note, or a stage line off a terminal)."""
        if not self.enabled:
            return
        with self._lock:
            if self.redraws and self._line:
                self.stream.write("\r\x1b[K")
            print(self._stamp(text), file=self.stream, flush=True)
            self._redraw_running()

    def _draw_stage(self, text: str) -> None:
        """On a terminal, the stage line redrawn in place; elsewhere a line that stays."""
        if not self.redraws:
            self._say(text)
            return
        with self._lock:
            self._line = "\r\x1b[K" + self._stamp(text)
            self.stream.write(self._line)
            self.stream.flush()

    def end(self) -> None:
        """The run is over: a stage line still drawn in place stays, followed by a newline (so
        that what is printed next starts a line of its own)."""
        self._end_line()

    def _end_line(self) -> None:
        """Keep the stage line drawn in place as it stands (a stage that failed says where)."""
        with self._lock:
            if self.redraws and self._line:
                self.stream.write("\n")
                self.stream.flush()
                self._line = ""

    def note(self, text: str) -> None:
        self._say(text)

    def warn(self, text: str) -> None:
        """One line on stderr that --quiet does not silence: something the user should know."""
        with self._lock:
            if self.redraws and self._line:
                self.stream.write("\r\x1b[K")
            print(f"warning: {text}", file=self.stream, flush=True)
            self._redraw_running()

    def _redraw_running(self) -> None:
        """After a line that stays: the running stage's line back under it (a finished stage's
        line is gone; the run's last line gives every stage's time)."""
        if self.redraws and self._line:
            if self._running:
                self.stream.write(self._line)
                self.stream.flush()
            else:
                self._line = ""

    def _step(self, key: str) -> str:
        """ "2/4 " for the second of a plan's four stages; "" for a stage outside the plan."""
        if not key or key not in self.plan:
            return ""
        keys = list(self.plan)
        return f"{keys.index(key) + 1}/{len(keys)} "

    def _left(self, key: str, elapsed: float) -> str:
        """ "about 3 min left" for a planned stage `elapsed` seconds in, when this stage's and all
        later stages' estimates are known; "" otherwise."""
        if not key or key not in self.plan:
            return ""
        keys = list(self.plan)
        estimate = self.plan[key]
        later = [self.plan[k] for k in keys[keys.index(key) + 1 :]]
        if estimate is None or any(e is None for e in later):
            return ""
        from aotc.stage_estimates import describe

        remaining = estimate - elapsed
        if remaining < 0:  # past its estimate: say so rather than count below zero
            return f"past its estimate of {describe(estimate).removeprefix('about ')}"
        return f"{describe(remaining + sum(later))} left"  # type: ignore[arg-type]

    @contextlib.contextmanager
    def stage(self, name: str, detail: Callable[[], str] | None = None, key: str = ""):
        """Announce a stage, keep saying it is alive, and report how long it took.

        `detail`, when given, is asked at each heartbeat for a few words on how far the stage got
        (a max-autotune build runs for an hour; "still working" alone says nothing). `key`, when
        given, keeps the stage's time in `seconds[key]` (a build's breakdown) and places the stage
        in the plan (set_plan), whose estimate its lines show.
        """
        name = self._step(key) + name
        left = self._left(key, 0.0)
        self._draw_stage(f"{name} ... {left}" if left else f"{name} ...")
        began = time.perf_counter()
        self._running = True
        stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(name, began, stop, detail, key), daemon=True
        )
        if self.enabled:
            beat.start()
        try:
            yield
        except BaseException:
            stop.set()
            if beat.is_alive():
                beat.join()
            self._running = False
            if self.enabled:
                self._draw_stage(f"{name}: stopped after {time.perf_counter() - began:.1f}s")
                self._end_line()
            raise
        finally:
            stop.set()
            if beat.is_alive():
                beat.join()
            self._running = False
            if key:
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - began
        self._draw_stage(f"{name}: done in {time.perf_counter() - began:.1f}s")

    def _heartbeat(self, name: str, began: float, stop: threading.Event, detail, key: str) -> None:
        wait = self.heartbeat_s
        while not stop.wait(wait):
            elapsed = time.perf_counter() - began
            words = [f"{elapsed:.0f}s"]
            if left := self._left(key, elapsed):
                words.append(left)
            if extra := (detail() if detail else ""):
                words.append(extra)
            self._draw_stage(f"{name}: still working ({', '.join(words)})")
            if not self.redraws:
                wait = min(2 * wait, MAX_HEARTBEAT_S)

    def breakdown(self) -> str:
        """ "load 14s, lower 29s, compile 180s, check 40s": the keyed stages' times, for the last line."""
        return ", ".join(f"{key} {seconds:.0f}s" for key, seconds in self.seconds.items())


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
