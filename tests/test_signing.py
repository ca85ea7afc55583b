"""Package signing: `aotc keygen`, `aotc sign`, `--require-signature` on both runners, `aotc verify`."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys

import pytest
import torch
from conftest import invoke

import aotc_runtime
from aotc import api
from aotc_runtime.__main__ import main as aotc_run


def copy_package(packages, tmp_path, name="pkg"):
    target = tmp_path / name
    shutil.copytree(packages.get("mlp").package, target)
    return target


@pytest.fixture
def signed(packages, tmp_path, keys):
    package = copy_package(packages, tmp_path)
    result = invoke("sign", package, "--key", keys.mine.private)
    assert result.exit_code == 0, result.stderr
    return package


def assert_refused(result, code, *fragments):
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_keygen_makes_a_working_pair_and_refuses_to_overwrite(tmp_path):
    private, public = tmp_path / "k.pem", tmp_path / "k.pub.pem"
    result = invoke("keygen", "--private-key", private, "--public-key", public)
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    before = private.read_bytes()

    again = invoke("keygen", "--private-key", private, "--public-key", public)
    assert_refused(again, 2, f"{private} already exists", "--force")
    assert private.read_bytes() == before

    forced = invoke("keygen", "--private-key", private, "--public-key", public, "--force")
    assert forced.exit_code == 0, forced.stderr
    assert private.read_bytes() != before
    same = invoke("keygen", "--private-key", private, "--public-key", private, "--force")
    assert_refused(same, 2, "different paths")


def test_signature_is_raw_ed25519_over_the_manifest_bytes(signed, keys):
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    signature = (signed / "manifest.json.sig").read_bytes()
    assert len(signature) == 64
    key = load_pem_public_key(keys.mine.public.read_bytes())
    key.verify(signature, (signed / "manifest.json").read_bytes())  # raises if it does not match


def test_signed_package_runs_with_require_signature(signed, keys):
    result = invoke("run", signed, "--require-signature", "--public-key", keys.mine.public)
    assert result.exit_code == 0, result.stderr
    assert "output_0" in result.stdout
    # --public-key alone asks for the same check
    assert invoke("run", signed, "--public-key", keys.mine.public).exit_code == 0


def test_unsigned_package_is_refused(packages, tmp_path, keys):
    package = copy_package(packages, tmp_path)
    result = invoke("run", package, "--require-signature", "--public-key", keys.mine.public)
    assert_refused(result, 7, "is not signed", f"aotc sign {package}")


def test_manifest_edited_after_signing_is_refused(signed, keys):
    manifest = (signed / "manifest.json").read_bytes()
    at = manifest.index(b'"created": "') + len(b'"created": "')
    digit = b"1" if manifest[at : at + 1] != b"1" else b"2"
    (signed / "manifest.json").write_bytes(manifest[:at] + digit + manifest[at + 1 :])
    result = invoke("run", signed, "--require-signature", "--public-key", keys.mine.public)
    assert_refused(result, 7, "was changed after it was signed, or signed by another key")


@pytest.mark.parametrize("swap", ["other content, same key", "random bytes", "truncated"])
def test_swapped_signature_is_refused(signed, keys, swap):
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    sig = signed / "manifest.json.sig"
    if swap == "other content, same key":
        key = load_pem_private_key(keys.mine.private.read_bytes(), password=None)
        sig.write_bytes(key.sign(b'{"format_version": 3}'))
    elif swap == "random bytes":
        sig.write_bytes(torch.randint(0, 256, (64,), dtype=torch.uint8).numpy().tobytes())
    else:
        sig.write_bytes(sig.read_bytes()[:63])
    result = invoke("run", signed, "--require-signature", "--public-key", keys.mine.public)
    fragment = (
        "not a 64-byte ed25519 signature" if swap == "truncated" else "changed after it was signed"
    )
    assert_refused(result, 7, fragment)


def test_wrong_key_is_refused(signed, keys):
    result = invoke("run", signed, "--require-signature", "--public-key", keys.other.public)
    assert_refused(result, 7, "signed by another key", str(keys.other.public))


def test_private_key_given_as_public_key_is_refused(signed, keys):
    result = invoke("run", signed, "--public-key", keys.mine.private)
    assert_refused(result, 7, "is not a PEM public key", "it is a private key")


def test_require_signature_needs_a_key(signed, keys):
    result = invoke("run", signed, "--require-signature")
    assert result.exit_code == 2 and "--require-signature needs --public-key" in result.stderr
    assert "Traceback" not in result.stderr
    cpp = invoke("run", signed, "--engine", "cpp", "--require-signature")
    assert cpp.exit_code == 2 and "--require-signature needs --public-key" in cpp.stderr


def test_the_cpp_engine_checks_the_signature_too(signed, keys):
    ok = invoke("run", signed, "--engine", "cpp", "--public-key", keys.mine.public)
    assert ok.exit_code == 0, ok.stderr
    other = invoke("run", signed, "--engine", "cpp", "--public-key", keys.other.public)
    assert other.exit_code == 7, other.stderr


def test_sign_refuses_a_damaged_package(packages, tmp_path, keys):
    package = copy_package(packages, tmp_path)
    with open(package / "model.pt2", "r+b") as handle:
        handle.seek(100)
        handle.write(b"\x00\x01\x02")
    result = invoke("sign", package, "--key", keys.mine.private)
    assert_refused(result, 7, "model.pt2 was modified")
    assert not (package / "manifest.json.sig").exists()


def test_aotc_run_takes_the_same_flags(signed, packages, tmp_path, keys, capsys):
    assert (
        aotc_run([str(signed), "--require-signature", "--public-key", str(keys.mine.public)]) == 0
    )
    assert aotc_run([str(signed), "--public-key", str(keys.other.public)]) == 7
    assert "signed by another key" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        aotc_run([str(signed), "--require-signature"])
    assert done.value.code == 2
    # the installed entry point, in a process of its own: one line, no traceback
    unsigned = copy_package(packages, tmp_path, "unsigned")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aotc_runtime",
            str(unsigned),
            "--public-key",
            str(keys.mine.public),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 7, proc.stderr
    assert proc.stderr.strip().startswith("error: ") and "is not signed" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_python_api_checks_the_signature(signed, packages, tmp_path, keys):
    package = aotc_runtime.load(signed, public_key=keys.mine.public)
    assert package(torch.randn(32, 128)).shape == (32, 10)
    with pytest.raises(aotc_runtime.PackageError, match="signed by another key"):
        aotc_runtime.load(signed, public_key=keys.other.public)
    with pytest.raises(aotc_runtime.PackageError, match="is not signed"):
        aotc_runtime.load(copy_package(packages, tmp_path, "unsigned"), public_key=keys.mine.public)


def test_verify_reruns_the_numeric_check(signed, keys):
    result = invoke(
        "verify", signed, "--require-signature", "--public-key", keys.mine.public, "--json"
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["exit_code"] == 0
    assert [c["name"] for c in report["checks"]] == [
        "manifest",
        "files",
        "compatibility",
        "signature",
        "load",
        "state",
        "numeric",
    ]
    assert all(c["status"] == "ok" for c in report["checks"]), report["checks"]
    recorded = json.loads((signed / "manifest.json").read_text())["numeric_check"]
    outputs = report["numeric_check"]["outputs"]
    assert [o["name"] for o in outputs] == [o["name"] for o in recorded["outputs"]]
    for out, then in zip(outputs, recorded["outputs"]):
        assert out["ok"] and out["max_abs"] <= recorded["atol"]
        assert (out["atol"], out["rtol"]) == (recorded["atol"], recorded["rtol"])
        assert out["recorded_max_abs"] == then["max_abs"]


def test_verify_prints_one_line_per_check(signed):
    result = invoke("verify", signed)
    assert result.exit_code == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("ok") and " numeric " in line for line in lines), result.stdout
    assert any(line.startswith("skipped") and " signature " in line for line in lines)


def test_verify_refuses_a_modified_model(packages, tmp_path):
    package = copy_package(packages, tmp_path)
    with open(package / "model.pt2", "r+b") as handle:
        handle.seek(200)
        byte = handle.read(1)
        handle.seek(200)
        handle.write(bytes([byte[0] ^ 0xFF]))
    result = invoke("verify", package)
    assert_refused(result, 7, "model.pt2 was modified")
    assert any(
        line.startswith("failed") and " files " in line for line in result.stdout.splitlines()
    )
    report = api.verify(package)
    assert not report["ok"] and report["exit_code"] == 7
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses == {
        "manifest": "ok",
        "files": "failed",
        "compatibility": "ok",
        "signature": "skipped",
        "load": "skipped",
        "state": "skipped",
        "numeric": "skipped",
    }


def test_verify_refuses_another_artifact(packages, tmp_path):
    package = copy_package(packages, tmp_path)
    other = tmp_path / "other.pt2"
    other.write_bytes(packages.get("mlp").artifact.read_bytes() + b"\0")
    result = invoke("verify", package, "--artifact", other)
    manifest = json.loads((package / "manifest.json").read_text())
    assert_refused(result, 2, str(other), manifest["source"]["sha256"])
