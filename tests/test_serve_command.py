"""`aotc-serve`, the serve command of a machine with only `aotc-runtime[serve]`: the same command as
`aotc serve` (options, help, exit codes), and it works with aotc not importable at all."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import invoke

# `aotc-serve ARGS` in a fresh process where `import aotc` fails, as on a machine without aotc
WITHOUT_AOTC = (
    "import sys; sys.modules['aotc'] = None\n"
    "from aotc_runtime.serve.command import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def aotc_serve(*args: str, code: str = WITHOUT_AOTC) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},  # the help's width: its own limit, not a terminal's
    )


def test_help_without_aotc_is_aotc_serve_help():
    result = aotc_serve("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: aotc-serve [OPTIONS] PACKAGE")
    assert "Exit codes:" in result.stdout and "aotc serve could not start" in result.stdout
    # the same command as `aotc serve`: only the usage line (the program's name) differs
    same = aotc_serve("serve", "--help", code="from aotc.cli.main import main; main()")
    assert same.returncode == 0, same.stderr
    assert same.stdout.startswith("Usage: aotc serve [OPTIONS] PACKAGE")
    assert result.stdout.splitlines()[1:] == same.stdout.splitlines()[1:]


def test_a_bad_option_without_aotc_is_one_line_and_exit_2(tmp_path):
    result = aotc_serve(str(tmp_path), "--threads", "0")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines() if line.startswith("error: --threads")
    ]
    assert "Traceback" not in result.stderr
    # and the same line and code through aotc
    through_aotc = invoke("serve", tmp_path, "--threads", "0")
    assert through_aotc.exit_code == 2
    assert through_aotc.stderr.strip() == result.stderr.strip()


def test_a_usage_error_without_aotc_is_click_s_and_exit_2(tmp_path):
    result = aotc_serve(str(tmp_path), "--require-signature")
    assert result.returncode == 2
    assert "--require-signature needs --public-key" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs aotc-runtime[serve]")
def test_no_package_without_aotc_is_one_line_and_exit_7(tmp_path):
    result = aotc_serve(str(tmp_path / "nothing"))
    assert result.returncode == 7, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "does not exist" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
