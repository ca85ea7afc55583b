"""`aotc-run PKG` / `python -m aotc_runtime PKG`: the runner for machines that have only the runtime.

argparse, not click: the runtime depends on torch alone.
"""

from __future__ import annotations

import argparse
import errno
import json
import sys

from .errors import AotcRuntimeError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="aotc-run", description="Run an aotc package (no compiler needed)."
    )
    parser.add_argument("package")
    parser.add_argument(
        "--input", action="append", default=[], help=".npy/.npz/.pt, in positional order"
    )
    parser.add_argument("--output", help="write outputs to .npz (output_0, ...) or .pt")
    parser.add_argument("--iters", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="threads calling at once, each making --iters calls"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--require-signature",
        action="store_true",
        help="refuse the package unless --public-key's private key signed it (`aotc sign`)",
    )
    parser.add_argument(
        "--public-key",
        metavar="PEM",
        help="ed25519 public key (`aotc keygen`); the package must be signed by its private key",
    )
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.require_signature and not args.public_key:
        parser.error(
            "--require-signature needs --public-key PEM: the key the package must be signed with"
        )
    from .runner import format_report, run_package

    _terminate_like_interrupt()
    try:
        report = run_package(
            args.package,
            args.input,
            args.output,
            args.iters,
            args.seed,
            public_key=args.public_key,
            threads=args.threads,
        )
    except AotcRuntimeError as exc:
        if args.verbose:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        # exit handlers run from here: the model's unpacked copy is removed (extraction.py)
        print("error: interrupted (Ctrl-C or SIGTERM)", file=sys.stderr)
        return 130
    except OSError as exc:
        if args.verbose or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = exc.filename or "the output folder"
        print(
            f"error: no space left on the device holding {where}; free space or write elsewhere",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _terminate_like_interrupt() -> None:
    """SIGTERM (what `timeout`, Docker and Kubernetes send) ends a run as Ctrl-C does, so exit
    handlers run; by default it ends the process on the spot."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


if __name__ == "__main__":
    sys.exit(main())
