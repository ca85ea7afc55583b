"""The Python runtime's leftovers: what a run leaves behind, and files that block.

- torch unpacks model.pt2 into an `aotinductor_*` folder; it was left in the temporary folder after
  a failed load and a SIGTERM'd `aotc-run` (and after every stopped serve replica).
- A FIFO in place of manifest.json.sig made `aotc run --require-signature` and `aotc verify` hang.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aotc_runtime
from aotc.compiler.package_writer import write_manifest

RUN = [sys.executable, "-m", "aotc_runtime"]


def leftovers(tmp: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))


def env_with_tmp(tmp: Path) -> dict:
    return {**os.environ, "TMPDIR": str(tmp)}


def start_a_long_run(packages, tmp: Path) -> subprocess.Popen:
    """`aotc-run` of many calls, returned once the model is unpacked under `tmp` and running."""
    child = subprocess.Popen(
        [*RUN, str(packages.get("mlp").package), "--iters", "100000000"],
        env=env_with_tmp(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(tmp.rglob("*.so")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(tmp.rglob("*.so")), "the package was never unpacked"
    return child


def test_a_run_leaves_nothing_in_the_temporary_folder(packages, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run(
        [*RUN, str(packages.get("mlp").package), "--iters", "2"],
        env=env_with_tmp(tmp), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert leftovers(tmp) == []


def test_a_failed_load_leaves_nothing(packages, tmp_path):
    """The model is unpacked, then refused (its manifest lies about its shape): the refusal must
    not leave the unpacked copy behind."""
    package = tmp_path / "lying"
    shutil.copytree(packages.get("mlp").package, package)
    manifest = aotc_runtime.read_manifest(package)
    data = manifest.to_json()
    data["signature"]["inputs"][0]["shape"][0] = 48
    write_manifest(package, aotc_runtime.Manifest.from_json(data))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run(
        [*RUN, str(package)], env=env_with_tmp(tmp), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 7, done.stderr
    assert "48 in the manifest but 32 in model.pt2" in done.stderr
    assert leftovers(tmp) == []


def test_sigterm_during_a_run_leaves_nothing(packages, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    child = start_a_long_run(packages, tmp)
    child.send_signal(signal.SIGTERM)
    _out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert err.strip().splitlines() == ["error: interrupted (Ctrl-C or SIGTERM)"]
    assert leftovers(tmp) == []


def test_what_a_killed_process_left_is_removed_by_the_next_load(packages, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    child = start_a_long_run(packages, tmp)
    child.kill()  # SIGKILL: nothing of the process runs again
    child.wait(timeout=60)
    assert [p.name.split("-")[2] for p in tmp.iterdir()] == [str(child.pid)]
    done = subprocess.run(
        [*RUN, str(packages.get("mlp").package)],
        env=env_with_tmp(tmp), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert leftovers(tmp) == []


@pytest.fixture
def signed_with_fifo(packages, tmp_path):
    package = tmp_path / "pkg"
    shutil.copytree(packages.get("mlp").package, package)
    private, public = tmp_path / "k.pem", tmp_path / "k.pub.pem"
    aotc_runtime.generate_keypair(private, public)
    os.mkfifo(package / "manifest.json.sig")
    return package, public


def test_a_fifo_for_a_signature_is_refused_not_waited_on(signed_with_fifo):
    package, public = signed_with_fifo
    done = subprocess.run(
        [*RUN, str(package), "--require-signature", "--public-key", str(public)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 7, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "manifest.json.sig cannot be read (not a regular file)" in line


def test_verify_refuses_a_fifo_for_a_signature(signed_with_fifo):
    package, public = signed_with_fifo
    done = subprocess.run(  # a child with a timeout: a regression hangs, it must not hang CI
        [sys.executable, "-m", "aotc", "verify", str(package), "--public-key", str(public), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = json.loads(done.stdout)
    signature = next(c for c in report["checks"] if c["name"] == "signature")
    assert signature["status"] == "failed"
    assert "not a regular file" in signature["detail"]
