"""Keep torch's own logging and warnings off the user's terminal unless --verbose."""

from __future__ import annotations

import contextlib
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
    logger = logging.getLogger("torch")
    old_level, old_propagate = logger.level, logger.propagate
    logger.setLevel(logging.CRITICAL + 1)
    handlers = list(logger.handlers)
    for handler in handlers:
        logger.removeHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for handler in handlers:
            logger.addHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
