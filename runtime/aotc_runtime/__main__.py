"""`aotc-run PKG` / `python -m aotc_runtime PKG`: the runner for machines that have only the runtime.

argparse, not click: the runtime depends on torch alone.
"""

from __future__ import annotations

import argparse
import json
import sys

from .exits import exit_code_of, terminate_like_interrupt


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

    def run() -> int:
        report = run_package(
            args.package,
            args.input,
            args.output,
            args.iters,
            args.seed,
            public_key=args.public_key,
            threads=args.threads,
        )
        print(json.dumps(report, indent=2) if args.json else format_report(report))
        return 0

    terminate_like_interrupt()
    return exit_code_of(run, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
