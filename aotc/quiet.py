"""Keep torch's own logging and warnings off the user's terminal unless --verbose."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings

VERBOSE_ENV = "AOTC_VERBOSE"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


@contextlib.contextmanager
def quiet_torch():
    """Silence torch's loggers and Python warnings for the duration (errors still raise)."""
    if verbose():
        yield
        return
    # torch configures handlers and levels on many child loggers, so switch logging off globally.
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        # Some torch paths print graphs straight to sys.stderr; those lines mean nothing to a user.
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
