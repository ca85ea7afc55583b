"""Which transformers releases aotc's generation hooks are written for, and what happens outside
them.

aotc drives a transformers model through its public extension points: a `Cache` of its own layers
(row_cache.py), an attention function registered in `AttentionInterface`, a 4-D mask, and the
model's forward arguments. Each is checked against the oldest and the newest release the test
suite runs (`make test`: the suite on the pinned release, the generation parity tests again on the
newest). A release outside that range gets one warning line; a hook that breaks anyway ends the
export with exit 3 and a line naming the release and the range, not an internal error.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from typing import Any

from aotc.errors import AotcError, ModelError

# The releases the suite runs: requirements.txt pins the oldest, requirements-newest.txt the newest.
# pyproject's `aotc[transformers]` extra declares OLDEST_TESTED up to the next major.
OLDEST_TESTED = "5.17.0"
NEWEST_TESTED = "5.24.0"
SUPPORTED = f">={OLDEST_TESTED},<6"
INSTALL = "pip install 'aotc[transformers]'"


def installed_release() -> str:
    import transformers

    return str(transformers.__version__)


def _release(text: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string; pre-releases and local parts count as their
    base release (5.25.0.dev0 is 5.25.0)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text).release[:3]
    except InvalidVersion:
        return ()


def is_tested(version: str) -> bool:
    """A release from OLDEST_TESTED to any patch release of NEWEST_TESTED's minor."""
    release = _release(version)
    newest = _release(NEWEST_TESTED)
    return bool(release) and _release(OLDEST_TESTED) <= release < (newest[0], newest[1] + 1)


def tested_range() -> str:
    newest = _release(NEWEST_TESTED)
    return f"{OLDEST_TESTED} to {newest[0]}.{newest[1]}.x"


def untested_warning(version: str) -> str | None:
    """The warning line for `version`, or None when it is a tested release."""
    if is_tested(version):
        return None
    return (
        f"transformers {version} is outside the releases aotc is tested with ({tested_range()}); "
        f"if the export fails, install a tested one: {INSTALL}"
    )


@functools.cache
def warn_if_untested() -> None:
    """Say once per process, on stderr, that the installed release is not a tested one."""
    line = untested_warning(installed_release())
    if line is not None:
        print(f"warning: {line}", file=sys.stderr, flush=True)


def cache_keyword(model: Any) -> str:
    """The forward argument that takes the model's cache: `cache` from transformers 5.24 (where
    `past_key_values` is deprecated until 5.40), `past_key_values` before."""
    accepts = inspect.signature(model.forward).parameters
    return "cache" if "cache" in accepts else "past_key_values"


@contextlib.contextmanager
def hooks_guard(model: Any):
    """Inside, an exception that is not aotc's own (a hook of aotc's that this release's model
    code calls in a way it was not written for) ends the export with exit 3, naming the release
    and the supported range, instead of an internal error."""
    try:
        yield
    except AotcError:
        raise
    except Exception as exc:
        version = installed_release()
        advice = (
            f"install a tested release: {INSTALL}"
            if not is_tested(version)
            else "this release is one aotc is tested with: rerun with --verbose and report it"
        )
        reason = " ".join(str(exc).split())[:200]
        raise ModelError(
            f"{type(model).__name__} fails in aotc's generation hooks under transformers "
            f"{version} ({type(exc).__name__}: {reason}); aotc supports transformers {SUPPORTED}, "
            f"tested {tested_range()}; {advice}"
        ) from exc
