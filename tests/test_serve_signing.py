"""`aotc serve --require-signature --public-key KEY`: the package is checked before Ray starts, and
again by every replica as it loads it (what it loads may have been swapped since). The signature
covers the manifest, and through its hashes the tokenizer and the generation record.

One Ray deployment in the module (the last test): a replica that refuses the package makes
`aotc serve` exit 7 with the replica's reason on one line, instead of waiting.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from conftest import free_port, invoke

pytest.importorskip("ray.serve")

from aotc_runtime.serve.replica import REFUSED, ReplicaSettings  # noqa: E402
from aotc_runtime.serve.shipping import PackageSource  # noqa: E402

pytestmark = pytest.mark.slow  # builds the package


@pytest.fixture
def signed(generation_packages, tmp_path, keys):
    """A copy of the GPT-2 package with a tokenizer, signed by `mine`."""
    package = tmp_path / "lm_pkg"
    shutil.copytree(generation_packages.with_tokenizer()[0], package)
    result = invoke("sign", package, "--key", keys.mine.private)
    assert result.exit_code == 0, result.stderr
    return package


def swap_tokenizer(package) -> None:
    """Another tokenizer in its place: two words trade ids (a prompt would read differently)."""
    path = package / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    vocab["w5"], vocab["w6"] = vocab["w6"], vocab["w5"]
    path.write_text(json.dumps(data))


def change_generation_record(package) -> None:
    path = package / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["generation"]["eos_token_ids"] = [5]
    path.write_text(json.dumps(manifest, indent=2))


def one_error_line(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


def test_require_signature_without_a_public_key_is_exit_2(tmp_path):
    result = invoke("serve", tmp_path / "pkg", "--require-signature", "--check")
    assert result.exit_code == 2, result.stderr
    assert (
        "Error: --require-signature needs --public-key PEM: the public key the package must be "
        "signed with"
    ) in result.stderr.splitlines()


@pytest.mark.parametrize(
    "change, words",
    [
        ("unsigned", "is not signed (it has no manifest.json.sig)"),
        ("tokenizer swapped", "tokenizer.json was modified (sha256 differs from the manifest)"),
        ("generation record changed", "fails its signature check against"),
        ("another key", "fails its signature check against"),
    ],
)
def test_serve_refuses_an_unsigned_or_altered_package_before_ray_starts(
    signed, keys, change, words
):
    import ray

    key = keys.mine.public
    if change == "unsigned":
        (signed / "manifest.json.sig").unlink()
    elif change == "tokenizer swapped":
        swap_tokenizer(signed)
    elif change == "generation record changed":
        change_generation_record(signed)
    else:
        key = keys.other.public
    result = invoke("serve", signed, "--require-signature", "--public-key", key, "--check")
    line = one_error_line(result, 7)
    assert words in line, line
    assert not ray.is_initialized()


def engine_for(package, key) -> object:
    from aotc_runtime.serve.completion_engine import CompletionEngine

    settings = ReplicaSettings(public_key_pem=key.read_bytes())
    return CompletionEngine(PackageSource(path=str(package)), settings, package.name)


def first_answer(engine) -> dict:
    async def first():
        events = engine.complete(b'{"prompt": "w5", "max_tokens": 1}')
        try:
            return await events.__anext__()
        finally:
            await events.aclose()

    return asyncio.run(first())


def test_a_replica_checks_the_signature_itself_as_it_loads(signed, keys):
    """A package swapped after `aotc serve` checked it: the replica refuses it, says why in its
    log (and to `aotc serve`), and answers clients 503 without the reason."""
    good = engine_for(signed, keys.mine.public)
    assert good.refused is None and good.tokenizer.encode("w5").ids == [5]
    assert engine_for(signed, keys.other.public).refused is not None
    swap_tokenizer(signed)
    swapped = engine_for(signed, keys.mine.public)
    assert "refused the package" in swapped.refused
    assert "tokenizer.json was modified" in swapped.refused and "\n" not in swapped.refused
    refused = first_answer(swapped)["refused"]
    assert (refused.status, str(refused)) == (503, REFUSED)
    assert swapped.health()["status"] == "refused" and "reason" not in swapped.health()


def test_serve_exits_7_with_the_reason_when_its_replica_refuses_the_package(
    signed, keys, monkeypatch
):
    """The package passes `aotc serve`'s own check, then is swapped before the replica loads it
    (as an inconsistent package the runtime refuses at load would be): the replica's refusal
    comes back through Ray as one line, exit 7, and everything started is taken down."""
    import ray

    import aotc_runtime.serve.app

    checked = aotc_runtime.serve.app.check_package

    def check_then_swap(options):
        manifest = checked(options)
        swap_tokenizer(signed)
        return manifest

    monkeypatch.setattr(aotc_runtime.serve.app, "check_package", check_then_swap)
    result = invoke(
        "serve", signed, "--require-signature", "--public-key", keys.mine.public,
        "--port", free_port(), "--check",
    )  # fmt: skip
    line = one_error_line(result, 7)
    assert "refused the package" in line and "tokenizer.json was modified" in line, line
    assert not ray.is_initialized()
