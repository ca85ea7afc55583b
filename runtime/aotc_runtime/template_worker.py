"""The process a chat template renders in (its parent's side is template_process.py).

The sandbox (template_sandbox.py) refuses escapes and checks the size of what a template makes,
with messages that say what was asked. It cannot bound everything: a value is built before it can
be measured, and a Jinja builtin can loop inside one call. So the template is compiled and rendered
here, in a process of its own:

- its address space is capped at MAX_ADDRESS_SPACE: a template that asks for more gets a
  MemoryError here (or this process dies), never the server's memory;
- its parent kills it when a compile or a render runs past its deadline, wherever the time goes;
- it imports only the sandbox and Jinja (not torch), so it starts in a fraction of a second;
- it ends itself (SIGALRM, whose default action ends a process even inside a C loop) a little
  after the deadline its parent gives each request, so a worker whose parent died mid-render
  does not spin on; between requests, its parent's end closes its input and it returns.

Messages are length-prefixed JSON on stdin and stdout. The first request is `{"template": text,
"seconds": deadline}`, answered `{"ok": true}` once compiled; each next one is `{"variables":
{...}, "seconds": deadline}`, answered `{"text": prompt}`. A failure is `{"kind": KIND, "message":
one line}` with KIND one of "syntax" (not Jinja), "stopped" (an escape or a bound), "refused" (the
template's raise_exception, or a variable it needed) or "failed" (its own arithmetic or indexing
on these messages).
"""

from __future__ import annotations

import json
import signal
import sys
from typing import IO, Any

MAX_ADDRESS_SPACE = 256 << 20  # bytes: Python and Jinja take ~50 MiB, a 4 Mi-character prompt ~70
HEADER_BYTES = 4  # a message's length, big-endian
GRACE_SECONDS = 2  # past the parent's deadline, before the worker ends itself


def write_message(stream: IO[bytes], message: dict) -> None:
    data = json.dumps(message, ensure_ascii=False).encode("utf-8")
    stream.write(len(data).to_bytes(HEADER_BYTES, "big") + data)
    stream.flush()


def read_message(stream: IO[bytes]) -> dict | None:
    """The next message, or None once the parent closed the pipe (it left or was killed)."""
    header = stream.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES:
        return None
    return json.loads(stream.read(int.from_bytes(header, "big")))


def _cap_address_space() -> None:
    try:
        import resource
    except ImportError:  # not a POSIX system: the parent's deadline still holds
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = MAX_ADDRESS_SPACE if hard == resource.RLIM_INFINITY else min(MAX_ADDRESS_SPACE, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200].rstrip(".") if text else type(exc).__name__


def _failure(exc: BaseException) -> dict:
    """What went wrong, as the parent reports it (see the module's text)."""
    import jinja2

    if isinstance(exc, jinja2.TemplateSyntaxError):
        return {"kind": "syntax", "message": f"line {exc.lineno}: {_first_line(exc)}"}
    if isinstance(exc, jinja2.exceptions.SecurityError):  # an escape, or a bound overstepped
        return {"kind": "stopped", "message": _first_line(exc)}
    if isinstance(exc, RecursionError | MemoryError):
        return {"kind": "stopped", "message": type(exc).__name__}
    if isinstance(exc, jinja2.TemplateError):  # raise_exception(...), or an undefined it needed
        return {"kind": "refused", "message": _first_line(exc)}
    return {"kind": "failed", "message": f"{type(exc).__name__}: {_first_line(exc)}"}


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """Compile the first request's template, then render it for each next request."""
    from .template_sandbox import BoundedSandbox, render_bounded

    first = read_message(requests)
    if first is None:
        return
    _end_after(first["seconds"])
    try:
        template: Any = BoundedSandbox().from_string(first["template"])
    except Exception as exc:  # noqa: BLE001  (every failure is the template's, told in one line)
        write_message(replies, _failure(exc))
        return
    signal.alarm(0)
    write_message(replies, {"ok": True})
    while (request := read_message(requests)) is not None:
        _end_after(request["seconds"])
        try:
            reply = {"text": render_bounded(template, **request["variables"])}
        except Exception as exc:  # noqa: BLE001
            reply = _failure(exc)
        signal.alarm(0)
        write_message(replies, reply)


def _end_after(seconds: float) -> None:
    """SIGALRM (not handled: its default action ends the process) once the deadline has passed."""
    signal.alarm(int(seconds) + 1 + GRACE_SECONDS)


def main() -> None:
    _cap_address_space()
    replies = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies goes to the parent's pipe
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
