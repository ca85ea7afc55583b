"""One generation at a time on a package: its KV cache is the package's state.

A generation is open from its first step until its stream ends or is closed, and a stream is a
Python generator: between two tokens it sits paused in whoever iterates it. What must not happen
while one is open is anything else that moves the cache: another generation, a plain call of the
package, `reset_state()`. Others wait while the open generation runs; a paused one is not waited
for forever:
- in its own thread it can never go on while that thread waits, so the call fails at once;
- in another thread the call waits while the open generation runs, and fails once it has sat
  paused for PAUSE_GRACE_S (a reader that stopped reading, not one that is slow to read).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import GenerationBusyError

PAUSE_GRACE_S = 5.0
_POLL_S = 0.05


class GenerationGate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread of the open generation
        self._paused_since: float | None = None  # set while its stream waits for its reader
        # how many times anyone took the gate (a generation, a call, a reset): whoever remembers
        # what the cache held can tell whether anyone else moved it since (prefix_cache.py)
        self.turns = 0

    @contextmanager
    def generation(self) -> Iterator[None]:
        """Held while a generation is open (around its whole stream)."""
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def acquire(self, what: str = "another generation") -> None:
        """Open a generation (a decode engine, decode_engine.py, holds it across its steps)."""
        self._enter(what)

    def release(self) -> None:
        self._owner = self._paused_since = None
        self._lock.release()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Around the stream's `yield`: the generation waits for its reader."""
        self._paused_since = time.monotonic()
        try:
            yield
        finally:
            self._paused_since = None

    @contextmanager
    def other_work(self, what: str) -> Iterator[None]:
        """Around a plain call or a reset: inside the open generation's own steps it runs (the
        generation calls the package itself); otherwise it waits for the open generation as
        another generation would."""
        if self._owner == threading.get_ident() and self._paused_since is None:
            yield
            return
        self._enter(what)
        try:
            yield
        finally:
            self.release()

    def _enter(self, what: str) -> None:
        me = threading.get_ident()
        while not self._lock.acquire(blocking=False):
            owner, paused_since = self._owner, self._paused_since
            if owner == me:
                raise GenerationBusyError(
                    f"{what} cannot run while a stream of this package is open in the same "
                    "thread; read that stream to its end or close() it first"
                )
            if paused_since is not None and time.monotonic() - paused_since > PAUSE_GRACE_S:
                raise GenerationBusyError(
                    f"{what} waited for a stream of this package that nobody has read for "
                    f"{PAUSE_GRACE_S:g} s; read it to its end or close() it first"
                )
            if self._lock.acquire(timeout=_POLL_S):
                break
        self._owner = me
        self.turns += 1
