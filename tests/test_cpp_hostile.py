"""The C++ runner and bundles against hostile or careless input: signatures, .npz files, the
--serve protocol, signals, the bundle launcher, AOTC_RUNNER and AOTC_CPUINFO.

Refusals are compared with the Python runtime's, line for line: both runtimes must say the same.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import warnings
import zipfile
from pathlib import Path

import numpy
import pytest
from conftest import invoke
from test_cpp_runner import assert_same_outputs, python_outputs, run_cpp

import aotc_runtime
from aotc.deploy.bundle import launcher_text
from aotc_runtime.errors import AotcRuntimeError
from aotc_runtime.runner import run_package


def python_says(package, inputs=(), public_key=None) -> tuple[int, str]:
    """The Python runtime's exit code and error line for the same run (as `aotc-run` prints it)."""
    try:
        run_package(str(package), [str(p) for p in inputs], None, 0, 0, public_key=public_key)
    except AotcRuntimeError as exc:
        return exc.exit_code, f"error: {exc}"
    return 0, ""


def cpp_says(runner, package, *args, env=None) -> tuple[int, str]:
    result = run_cpp(runner, package, *args, env=env)
    return result.returncode, result.stderr.strip()


def assert_same_refusal(runner, package, inputs=(), public_key=None, code=None):
    args = [a for path in inputs for a in ("--input", path)]
    if public_key is not None:
        args += ["--public-key", public_key]
    python, cpp = python_says(package, inputs, public_key), cpp_says(runner, package, *args)
    assert cpp == python, (cpp, python)
    assert code is None or cpp[0] == code, cpp
    assert len(cpp[1].splitlines()) == 1 and cpp[1].startswith("error: "), cpp


# --- signatures --------------------------------------------------------------------------------


@pytest.fixture
def signed(packages, tmp_path, keys):
    package = tmp_path / "signed"
    shutil.copytree(packages.get("mlp").package, package)
    aotc_runtime.sign_package(package, keys.mine.private)
    return package


def test_runner_runs_a_signed_package(runner, signed, keys):
    result = run_cpp(runner, signed, "--require-signature", "--public-key", keys.mine.public)
    assert result.returncode == 0, result.stderr
    assert run_cpp(runner, signed, "--public-key", keys.mine.public).returncode == 0


def test_runner_refuses_what_the_python_runtime_refuses(runner, signed, packages, tmp_path, keys):
    mine, other = keys.mine.public, keys.other.public
    assert_same_refusal(runner, signed, public_key=other, code=7)  # signed by another key
    assert_same_refusal(runner, signed, public_key=keys.mine.private, code=7)  # a private key
    assert_same_refusal(runner, signed, public_key=tmp_path / "none.pem", code=7)
    sig = signed / "manifest.json.sig"
    good = sig.read_bytes()
    for swapped in (good[:63], good + good, bytes(64)):
        sig.write_bytes(swapped)
        assert_same_refusal(runner, signed, public_key=mine, code=7)
    sig.write_bytes(good)
    manifest = signed / "manifest.json"
    text = manifest.read_bytes()
    manifest.write_bytes(text.replace(b'"created": "2', b'"created": "3', 1))
    assert_same_refusal(runner, signed, public_key=mine, code=7)  # changed after signing
    manifest.write_bytes(text)
    sig.unlink()
    assert_same_refusal(runner, signed, public_key=mine, code=7)  # not signed


def test_a_fifo_for_the_signature_or_key_is_refused_at_once(runner, signed, tmp_path, keys):
    sig = signed / "manifest.json.sig"
    sig.unlink()
    os.mkfifo(sig)  # a plain open() would wait for a writer forever
    code, line = cpp_says(runner, signed, "--public-key", keys.mine.public)
    assert code == 7 and "manifest.json.sig cannot be read (not a regular file)" in line
    os.mkfifo(tmp_path / "key.pem")
    code, line = cpp_says(runner, signed, "--public-key", tmp_path / "key.pem")
    assert code == 7 and "cannot be read (not a regular file)" in line


def test_signature_flags_on_the_command_line(runner, signed, keys):
    code, line = cpp_says(runner, signed, "--require-signature")
    assert code == 2 and "--require-signature needs --public-key" in line
    key = keys.mine.public
    code, line = cpp_says(runner, signed, "--public-key", key, "--public-key", key)
    assert code == 2 and "--public-key is given twice" in line


# --- .npz inputs -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_input(packages):
    package = packages.get("two_input").package
    signature = aotc_runtime.load(package).signature
    return package, signature.input_names, [t.numpy() for t in signature.random_inputs(seed=4)]


def test_npz_by_name_by_position_compressed_and_mixed(runner, two_input, tmp_path):
    package, (a, b), (x, y) = two_input
    numpy.savez(tmp_path / "named.npz", **{b: y, a: x})  # any order
    numpy.savez(tmp_path / "positional.npz", x, y)
    numpy.savez_compressed(tmp_path / "compressed.npz", **{a: x, b: y})
    numpy.save(tmp_path / "first.npy", x)
    numpy.savez(tmp_path / "rest.npz", **{b: y})
    import torch

    expected = python_outputs(package, [torch.from_numpy(x), torch.from_numpy(y)])
    for inputs in (
        ["named.npz"],
        ["positional.npz"],
        ["compressed.npz"],
        ["first.npy", "rest.npz"],
    ):
        args = [a for name in inputs for a in ("--input", tmp_path / name)]
        result = run_cpp(runner, package, *args, "--output", tmp_path / "out.npz")
        assert result.returncode == 0, (inputs, result.stderr)
        assert_same_outputs(tmp_path / "out.npz", expected)


def _zip(path: Path, entries: list, method=zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", method) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return path


def _npy(array) -> bytes:
    import io

    buffer = io.BytesIO()
    numpy.save(buffer, array)
    return buffer.getvalue()


def test_npz_refusals_match_the_python_runtime(runner, two_input, tmp_path):
    package, (a, b), (x, y) = two_input
    cases = {}

    def case(name, path):
        cases[name] = [path]

    # the finding: a typo'd name used to be read in archive order, swapping the inputs
    numpy.savez(tmp_path / "typo.npz", **{b: y, f"{a}_typo": x})
    case("typo", tmp_path / "typo.npz")
    numpy.savez(tmp_path / "extra.npz", **{a: x, b: y, "c": y})
    case("one entry too many", tmp_path / "extra.npz")
    numpy.savez(tmp_path / "half.npz", **{a: x})
    case("an input missing", tmp_path / "half.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it is asked to write
        case(
            "an entry twice",
            _zip(tmp_path / "twice.npz", [(f"{a}.npy", _npy(x)), (f"{a}.npy", _npy(x))]),
        )
    case("not an array", _zip(tmp_path / "txt.npz", [(f"{a}.npy", _npy(x)), ("notes.txt", b"hi")]))
    case(
        "wrong dtype in a header",
        _zip(
            tmp_path / "dtype.npz", [(f"{a}.npy", _npy(x.astype("float64"))), (f"{b}.npy", _npy(y))]
        ),
    )
    case(
        "header longer than its entry",
        _zip(tmp_path / "short.npz", [(f"{a}.npy", _npy(x)[:-8]), (f"{b}.npy", _npy(y))]),
    )
    case(
        "entry longer than its header",
        _zip(tmp_path / "long.npz", [(f"{a}.npy", _npy(x) + b"\0" * 8), (f"{b}.npy", _npy(y))]),
    )
    case(
        "compression method",
        _zip(
            tmp_path / "bz.npz", [(f"{a}.npy", _npy(x)), (f"{b}.npy", _npy(y))], zipfile.ZIP_BZIP2
        ),
    )
    # a stored entry with one data byte flipped: its CRC-32 no longer matches
    numpy.savez(tmp_path / "crc.npz", **{a: x, b: y})
    data = bytearray((tmp_path / "crc.npz").read_bytes())
    data[200] ^= 0xFF
    (tmp_path / "crc.npz").write_bytes(bytes(data))
    case("bad CRC", tmp_path / "crc.npz")
    # an end record that claims 40,000 entries: refused before the directory is read
    numpy.savez(tmp_path / "many.npz", **{a: x, b: y})
    data = bytearray((tmp_path / "many.npz").read_bytes())
    data[-12:-10] = data[-14:-12] = (40000).to_bytes(2, "little")
    (tmp_path / "many.npz").write_bytes(bytes(data))
    case("40,000 entries", tmp_path / "many.npz")
    (tmp_path / "junk.npz").write_bytes(b"PK" + b"\0" * 100)
    case("not a zip", tmp_path / "junk.npz")
    numpy.save(tmp_path / "first.npy", x)
    numpy.save(tmp_path / "second.npy", y)
    cases["three arrays for two inputs"] = [
        tmp_path / "first.npy",
        tmp_path / "second.npy",
        tmp_path / "first.npy",
    ]
    cases["npz naming an input already given"] = [tmp_path / "first.npy", tmp_path / "half.npz"]
    for name, inputs in cases.items():
        python = python_says(package, inputs)
        assert python[0] == 8, (name, python)
        args = [a for path in inputs for a in ("--input", path)]
        assert cpp_says(runner, package, *args) == python, name


# --- aotc-runner --serve -----------------------------------------------------------------------


def test_serve_answers_every_line_and_keeps_going(runner, two_input, tmp_path):
    package, (a, b), (x, y) = two_input
    folder = tmp_path / "with space"
    folder.mkdir()
    numpy.savez(folder / "in puts.npz", **{a: x, b: y})
    lines = [
        b"time 1 1",  # before any inputs
        b"inputs " + str(folder / "in puts.npz").encode(),  # the rest of the line is the path
        b"time 3 1",
        b"time abc",
        b"time 1",
        b"time 1000001 0",  # above the documented bound: a typo must not run for hours
        b"time -1 2",
        b"\xff\xfe",  # not UTF-8
        b"",
        b"frobnicate",
        b"inputs",
        b"time 2 0",  # the inputs of line 2 still hold
        b"inputs /tmp/\xe9t\xe9.npz",  # a Latin-1 path
        b"time 1 0",  # a failed `inputs` leaves none
        b"quit",
    ]
    result = subprocess.run(
        [str(runner), str(package), "--serve"],
        input=b"\n".join(lines) + b"\n",
        capture_output=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert answers[0]["ready"] is True
    answers = answers[1:]
    assert len(answers) == len(lines) - 2  # the blank line and quit are not answered
    errors = {i: answer for i, answer in enumerate(answers) if "error" in answer}
    assert set(errors) == {0, 3, 4, 5, 6, 7, 8, 9, 11, 12}, answers
    assert "before `time`" in errors[0]["error"] and "before `time`" in errors[12]["error"]
    assert answers[1]["ran"] == "model.pt2" and answers[1]["first_call_ms"] > 0
    assert len(answers[2]["samples_ms"]) == 3
    for i in (3, 4, 5, 6):
        assert "each 0 to 1000000" in errors[i]["error"] and errors[i]["exit_code"] == 2
    assert "unknown command" in errors[7]["error"]
    assert "unknown command 'frobnicate'" in errors[8]["error"]
    assert "inputs needs a file" in errors[9]["error"]
    assert len(answers[10]["samples_ms"]) == 2
    assert errors[11]["exit_code"] == 8 and "does not exist" in errors[11]["error"]


def test_iteration_counts_are_bounded(runner, two_input):
    package = two_input[0]
    for flag in ("--iters", "--warmup"):
        code, line = cpp_says(runner, package, flag, "1000001")
        assert code == 2 and "from 0 to 1000000" in line, line


# --- signals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_runner_leaves_nothing_behind(runner, packages, tmp_path, stop):
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.Popen(
        [str(runner), str(packages.get("mlp").package), "--serve"],
        env={**os.environ, "TMPDIR": str(temp)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a suite started in the background (`cmd &`) inherits SIGINT ignored, and the runner
        # rightly leaves an ignored signal ignored: give the runner the default, as a terminal does
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # The serve loop answers only once the package is loaded: the signal comes to a runner
        # that has unpacked its model, not to one still unpacking it (a stop during the unpacking
        # races torch's writes; under CI's load that window is long enough to be hit).
        proc.stdin.write(b"time 1 0\n")
        proc.stdin.flush()
        assert proc.stdout.readline(), "the runner never answered"
        assert list(temp.glob("aotc-runtime-*/aotinductor_*")), list(temp.iterdir())
        proc.send_signal(stop)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert b"interrupted" in stderr
    assert list(temp.iterdir()) == []


def test_folders_of_killed_runners_are_removed_by_the_next(runner, packages, tmp_path):
    temp = tmp_path / "tmp"
    (temp / "aotc-runtime-999999999-abc123" / "aotinductor_x").mkdir(parents=True)  # no such pid
    alive = temp / f"aotc-runtime-{os.getpid()}-abc123"
    alive.mkdir()
    result = run_cpp(runner, packages.get("mlp").package, env={**os.environ, "TMPDIR": str(temp)})
    assert result.returncode == 0, result.stderr
    assert list(temp.iterdir()) == [alive]


# --- AOTC_CPUINFO and AOTC_RUNNER ---------------------------------------------------------------


def test_an_unusable_cpuinfo_file_fails_closed_in_both_runtimes(
    runner, packages, tmp_path, monkeypatch
):
    package = packages.get("mlp").package
    assert aotc_runtime.read_manifest(package).device.cpu_features  # the check applies
    (tmp_path / "noflags").write_text("processor\t: 0\n")
    os.mkfifo(tmp_path / "fifo")
    for cpuinfo in (tmp_path / "missing", tmp_path, tmp_path / "noflags", tmp_path / "fifo"):
        monkeypatch.setenv("AOTC_CPUINFO", str(cpuinfo))
        python = python_says(package)
        cpp = cpp_says(runner, package, env=dict(os.environ))
        assert cpp == python, (cpuinfo, cpp, python)
        assert cpp[0] == 7 and f"$AOTC_CPUINFO is {cpuinfo}" in cpp[1] and "unset it" in cpp[1]


@pytest.mark.parametrize("kind", ["not executable", "a folder", "not a program"])
def test_a_bad_aotc_runner_is_a_usage_error(tmp_path, monkeypatch, kind):
    target = tmp_path / "runner"
    if kind == "a folder":
        target.mkdir()
    else:
        target.write_text("not a program\n")
        target.chmod(0o755 if kind == "not a program" else 0o644)
    monkeypatch.setenv("AOTC_RUNNER", str(target))
    result = invoke("run", tmp_path / "pkg", "--engine", "cpp")
    assert result.exit_code == 2, result.stderr
    assert f"$AOTC_RUNNER is {target}" in result.stderr and "unset it" in result.stderr
    assert "internal error" not in result.stderr


# --- the bundle launcher -----------------------------------------------------------------------

FAKE_RUNNER = '#!/bin/sh\nprintf "%s\\n" "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" "$@"\n'


def fake_bundle(folder: Path, signed: bool = False) -> Path:
    """A bundle's launcher over a runner that prints what it was given: the launcher's logic alone."""
    (folder / "bin").mkdir(parents=True)
    (folder / "run").write_text(launcher_text(signed))
    (folder / "bin" / "aotc-runner").write_text(FAKE_RUNNER)
    for path in (folder / "run", folder / "bin" / "aotc-runner"):
        path.chmod(0o755)
    return folder


def launch(command, cwd, **env) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=60)


def test_launcher_through_a_symbolic_link_on_path(tmp_path):
    bundle = fake_bundle(tmp_path / "model_bundle").resolve()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "model").symlink_to(bundle / "run")
    (tmp_path / "link2").symlink_to(Path("bin") / "model")  # a relative link to the link
    for command in (["model", "--iters", "3"], [str(tmp_path / "link2"), "--iters", "3"]):
        result = launch(command, tmp_path, PATH=f"{bin_dir}:/usr/bin:/bin")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == f"LD_LIBRARY_PATH={bundle}/lib"
        assert lines[1:] == [str(bundle / "package"), "--iters", "3"]


def test_launcher_refuses_a_path_the_library_path_would_split(tmp_path):
    bundle = fake_bundle(tmp_path / "a:b" / "model_bundle")
    result = launch([str(bundle / "run")], tmp_path)
    assert result.returncode == 2 and result.stdout == ""  # the runner never started
    assert (
        result.stderr.startswith("error: the bundle is in ") and "move the bundle" in result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1


def test_launcher_never_puts_the_current_directory_on_the_library_path(tmp_path):
    bundle = fake_bundle(tmp_path / "b", signed=True).resolve()
    caller = ":/opt/libs::relative/lib;/more:"
    result = launch([str(bundle / "run")], tmp_path, LD_LIBRARY_PATH=caller, CDPATH=str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"LD_LIBRARY_PATH={bundle}/lib:/opt/libs:/more"
    key = str(bundle / "public_key.pem")
    assert lines[1:] == [str(bundle / "package"), "--require-signature", "--public-key", key]


# --- a signed bundle ---------------------------------------------------------------------------


def test_signed_bundle_refuses_an_altered_package(runner, packages, tmp_path, keys, monkeypatch):
    monkeypatch.setenv("AOTC_RUNNER", str(runner))
    package = tmp_path / "pkg"
    shutil.copytree(packages.get("mlp").package, package)
    bundle = tmp_path / "bundle"
    unsigned = invoke("bundle", package, "-o", bundle, "--public-key", keys.mine.public)
    assert unsigned.exit_code == 7 and "is not signed" in unsigned.stderr  # refused before copying
    assert invoke("bundle", package, "-o", bundle, "--require-signature").exit_code == 2
    aotc_runtime.sign_package(package, keys.mine.private)
    result = invoke(
        "bundle",
        package,
        "-o",
        bundle,
        "--require-signature",
        "--public-key",
        keys.mine.public,
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["requires_signature"] is True

    def run_bundle():
        return launch([str(bundle / "run")], tmp_path, PATH=str(tmp_path / "empty"))

    assert run_bundle().returncode == 0, run_bundle().stderr
    inside = bundle / "package"
    manifest = json.loads((inside / "manifest.json").read_text())
    manifest["mode"] = "max-autotune"  # what an attacker would change, hash and signature redone
    (inside / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))
    aotc_runtime.sign_package(inside, keys.other.private)
    refused = run_bundle()
    assert refused.returncode == 7 and "signed by another key" in refused.stderr, refused.stderr
    (inside / "manifest.json.sig").unlink()
    refused = run_bundle()
    assert refused.returncode == 7 and "is not signed" in refused.stderr, refused.stderr
