"""How the runtime's commands (`aotc-run`, `aotc-serve`) end: `error: <one line>` on stderr and
the exit code of the table in errors.py, the one aotc's CLI uses; a traceback only when asked for.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable

from .errors import INTERRUPTED_EXIT_CODE, AotcRuntimeError


def exit_code_of(command: Callable[[], int | None], verbose: bool = False) -> int:
    """Run `command`; its own code (None: 0), or an error's one line on stderr and its code."""
    try:
        code = command()
        return code if isinstance(code, int) else 0
    except AotcRuntimeError as exc:
        if verbose:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        # exit handlers run from here: the model's unpacked copy is removed (extraction.py)
        print("error: interrupted (Ctrl-C or SIGTERM)", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except OSError as exc:
        if verbose or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = exc.filename or "the output folder"
        print(
            f"error: no space left on the device holding {where}; free space or write elsewhere",
            file=sys.stderr,
        )
        return 2


def terminate_like_interrupt() -> None:
    """SIGTERM (what `timeout`, Docker and Kubernetes send) ends a command as Ctrl-C does, so exit
    handlers run; by default it ends the process on the spot."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
