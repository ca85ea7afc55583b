"""The `aotc` command line: parse flags, build a config, call one aotc.api function, print the result.

Heavy imports (torch) happen inside commands so `aotc --help` stays fast.
"""

from __future__ import annotations

import errno
import os
import sys

import click

from aotc.cli.bench import bench
from aotc.cli.build import build
from aotc.cli.bundle import bundle
from aotc.cli.chat import chat
from aotc.cli.explain import explain
from aotc.cli.export import export
from aotc.cli.generate import generate
from aotc.cli.keys import keygen, sign
from aotc.cli.run import run
from aotc.cli.serve import serve
from aotc.cli.types import exit_codes_epilog
from aotc.cli.verify import verify
from aotc.errors import INTERRUPTED_EXIT_CODE, AotcError, AotcRuntimeError, DiskFullError
from aotc.quiet import VERBOSE_ENV


class AotcGroup(click.Group):
    """click.Group whose main() maps errors to the exit-code table (also under CliRunner)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        terminate_like_interrupt()
        code = run_reporting_errors(
            lambda: super(AotcGroup, self).main(
                args, prog_name, complete_var, standalone_mode=False, **extra
            ),
            verbose="--verbose" in args,
        )
        sys.exit(code)


@click.group(
    cls=AotcGroup,
    epilog=exit_codes_epilog(),
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.version_option(package_name="aotc", prog_name="aotc")
@click.option("--verbose", is_flag=True, help="Show torch's logs and full tracebacks.")
def cli(verbose):
    """aotc: export a PyTorch model, compile it ahead of time, run it with no compile and no warm-up.

    \b
      aotc export model.py --input-shape 32x128 -o model.pt2
      aotc build model.pt2 --mode max-autotune   (-> model_pkg/, on the GPU when there is one)
      aotc run model_pkg/ --iters 100
    """
    # Set or cleared on every invocation: one --verbose must not leak into the next in-process call.
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    else:
        os.environ.pop(VERBOSE_ENV, None)


for command in (export, build, run, generate, serve, bench, explain, bundle, keygen, sign, verify):
    cli.add_command(command)
cli.add_command(chat)


def terminate_like_interrupt() -> None:
    """SIGTERM (what `timeout`, Docker and CI send) ends a command as Ctrl-C does: the same clean-up
    (temporary folders removed, nothing half-written), the same message and exit code."""
    import signal
    import threading

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def run_reporting_errors(invoke, verbose: bool) -> int:
    """Run a CLI invocation; turn every failure into a one-line error and a documented exit code."""
    try:
        # click's main with standalone_mode=False returns the code of a click.exceptions.Exit
        # (`aotc run --engine cpp` exits with the runner's code); a command's own return is None.
        code = invoke()
        return code if isinstance(code, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted; nothing was written", err=True)
        return INTERRUPTED_EXIT_CODE
    except (AotcError, AotcRuntimeError) as exc:
        show_traceback(verbose)
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except OSError as exc:
        show_traceback(verbose)
        if exc.errno in (
            errno.ENOSPC,
            errno.EDQUOT,
        ):  # the disk, not aotc: say where (the writers clean up)
            where = exc.filename or "the output folder"
            click.echo(
                f"error: no space left on the device holding {where}; free space or write elsewhere",
                err=True,
            )
            return 2
        click.echo(
            f"error: internal error in aotc: OSError: {exc}; rerun with --verbose and report it",
            err=True,
        )
        return 1
    except Exception as exc:  # our own bug: say so, briefly
        show_traceback(verbose)
        click.echo(
            f"error: internal error in aotc: {type(exc).__name__}: {exc}; rerun with --verbose and report it",
            err=True,
        )
        return 1


def show_traceback(verbose: bool) -> None:
    """--verbose adds the traceback above the one-line error; the exit code stays the error's own
    (a script must not see another code because someone asked for details)."""
    if verbose:
        import traceback

        traceback.print_exc()


def main(argv=None) -> int:
    """Console entry point (`aotc`, `python -m aotc`)."""
    try:
        cli.main(args=argv, prog_name="aotc")
    except SystemExit as done:
        if DiskFullError.leave_at_once:
            # Reported; torch's failed native writer would abort the process as it is destroyed.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(done.code if isinstance(done.code, int) else 2)
        if done.code == INTERRUPTED_EXIT_CODE:
            # Cleaned up and reported. Leave now: an interrupt that reaches Python's shutdown (torch's
            # compile-worker pool is torn down there) would make the exit a death by SIGINT.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(INTERRUPTED_EXIT_CODE)
        raise


if __name__ == "__main__":
    main()
