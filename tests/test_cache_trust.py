"""The build cache is an input, not a trusted store.

Each test starts from a copy of one cache filled by a tuned, specialized build of the dynamic MLP
(one candidate, members at B=8: two child builds), changes the copy as an attacker or bad luck
would, builds again, and asks for a package that answers as eager does, or a refusal: never a
wrong package. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import eager_model, invoke

import aotc_runtime
from aotc.compiler.package_writer import write_manifest

BUILD = ["--device", "cpu", "--tune", "--tune-candidates", "inductor", "--specialize", "B=8"]

PLANTED_MODEL = '''
import torch

class Other(torch.nn.Module):
    """Another model with the MLP's signature: x [N, 128] -> [N, 10]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(123)
        self.fc = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(x) * 3.0

def get_model():
    return Other()
'''


@pytest.fixture(scope="module")
def filled_cache(packages, tmp_path_factory) -> Path:
    """A cache holding the dynamic model's build, the B=8 member's and the B=8 artifact."""
    root = tmp_path_factory.mktemp("trusted-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AOTC_CACHE_DIR", str(root))
        artifact = packages.get("dynamic_mlp").artifact
        result = invoke("build", artifact, *BUILD, "-o", root.parent / "first", "--quiet")
        assert result.exit_code == 0, result.stderr
    return root


@pytest.fixture
def cache(filled_cache, tmp_path, monkeypatch) -> Path:
    """A private copy of the filled cache, used by this test's builds."""
    root = tmp_path / "cache"
    shutil.copytree(filled_cache, root)
    root.chmod(0o700)
    monkeypatch.setenv("AOTC_CACHE_DIR", str(root))
    return root


def cached_package(cache: Path, member: bool) -> Path:
    """The cached build of the dynamic model (member=False) or of the B=8 member."""
    for folder in sorted((cache / "tune" / "builds").glob("*/package")):
        dims = json.loads((folder / "manifest.json").read_text())["signature"]["dims"]
        if bool(dims) != member:
            return folder
    raise AssertionError(f"no cached {'member' if member else 'dynamic'} build in {cache}")


def zero_weights(model_file: Path) -> None:
    """Rewrite the archive with its weights blob zeroed: the model still loads and runs."""
    rewrite_archive(
        model_file, lambda name, data: bytes(len(data)) if name.endswith(".blob") else data
    )


def rewrite_archive(path: Path, change) -> None:
    with zipfile.ZipFile(path) as archive:
        entries = [(info, change(info.filename, archive.read(info))) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in entries:
            archive.writestr(info, data)


def build(packages, output: Path, *extra: str):
    return invoke("build", packages.get("dynamic_mlp").artifact, *BUILD, *extra, "-o", output)


def assert_answers_as_eager(package_dir: Path) -> None:
    package = aotc_runtime.load(package_dir)
    assert sorted(package.specializations) == ["B=8"]
    model = eager_model("dynamic_mlp")
    for batch in (3, 8, 64):  # the dynamic model, the member, the dynamic model at its max
        x = torch.randn(batch, 128)
        with torch.no_grad():
            torch.testing.assert_close(package(x), model(x), atol=1e-4, rtol=1e-4)


def test_a_damaged_cache_entry_is_rebuilt_with_a_warning(packages, cache, tmp_path):
    """As first found: weights zeroed in the cached winner, a shared object swapped into the
    member's entry. Both differ from their entry's manifest, so each is removed and built again."""
    zero_weights(cached_package(cache, member=False) / "model.pt2")
    swapped = cached_package(cache, member=True) / "model.pt2"
    shutil.copyfile(packages.get("mlp").model_file, swapped)
    result = build(packages, tmp_path / "pkg")
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and all("damaged" in w and "building it again" in w for w in warnings)
    assert "model.pt2 was modified" in warnings[0]
    tuning = json.loads((tmp_path / "pkg" / "manifest.json").read_text())["tuning"]
    assert tuning["builds_from_cache"] == 0 and tuning["assembled_check"]["passed"]
    assert_answers_as_eager(tmp_path / "pkg")


def test_swapped_code_with_rewritten_hashes_is_rebuilt(packages, cache, tmp_path):
    """Another model's compiled code in the member's entry, its manifest's hashes rewritten to
    match (an attacker who knows the format): the entry reads as whole, the runtime's contract
    check refuses it in the assembled check's child, and what came from the cache is rebuilt."""
    folder = cached_package(cache, member=True)
    shutil.copyfile(packages.get("mlp").model_file, folder / "model.pt2")
    write_manifest(folder, aotc_runtime.read_manifest(folder))
    result = build(packages, tmp_path / "pkg")
    assert result.exit_code == 0, result.stderr
    assert "the assembled package failed its check" in result.stderr
    assert "building them again" in result.stderr
    assert_answers_as_eager(tmp_path / "pkg")


@pytest.fixture(scope="module")
def planted_artifact(tmp_path_factory) -> Path:
    """Another model's static B=8 export, with the input and output the MLP's member has."""
    folder = tmp_path_factory.mktemp("planted")
    (folder / "other.py").write_text(PLANTED_MODEL)
    result = invoke(
        "export", folder / "other.py", "--input-shape", "8x128", "-o", folder / "other.pt2"
    )
    assert result.exit_code == 0, result.stderr
    return folder / "other.pt2"


def specialized_artifact_in(cache: Path) -> Path:
    (path,) = (cache / "tune" / "artifacts").glob("*.pt2")
    return path


def test_a_planted_specialized_artifact_is_refused_and_derived_again(
    packages, cache, planted_artifact, tmp_path
):
    """As first found: another model's export at the cache key of the B=8 re-export."""
    shutil.copyfile(planted_artifact, specialized_artifact_in(cache))
    result = build(packages, tmp_path / "pkg")
    assert result.exit_code == 0, result.stderr
    assert "the tune cache's artifact for B=8 is not" in result.stderr
    assert "it records no source artifact" in result.stderr
    assert_answers_as_eager(tmp_path / "pkg")


def test_a_planted_artifact_that_forges_its_record_is_caught_by_the_assembled_check(
    packages, cache, planted_artifact, tmp_path
):
    """The plant claims to be the MLP at B=8 (its aotc.json copied from the real one), and the
    member's cached build is gone, so the member is built from the plant: the assembled package's
    check against the user's artifact refuses it, and the retry derives and builds it afresh."""
    real = specialized_artifact_in(cache)
    with zipfile.ZipFile(real) as archive:
        record = next(n for n in archive.namelist() if n.endswith("/extra/aotc.json"))
        claimed = archive.read(record)
    shutil.copyfile(planted_artifact, real)
    rewrite_archive(real, lambda name, data: claimed if name.endswith("/extra/aotc.json") else data)
    shutil.rmtree(cached_package(cache, member=True).parent)
    result = build(packages, tmp_path / "pkg")
    assert result.exit_code == 0, result.stderr
    assert "the assembled package failed its check" in result.stderr
    assert_answers_as_eager(tmp_path / "pkg")
    # `aotc verify` checks the member through the package's routing against the user's artifact
    verified = invoke("verify", tmp_path / "pkg")
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    assert "members B=8 run through the package's routing" in verified.stdout


@pytest.mark.parametrize("how", ["writable by others", "owned by another user"])
def test_a_cache_others_can_write_is_refused(packages, tmp_path, monkeypatch, how):
    """The cache decides what a build produces; one others control is refused."""
    root = tmp_path / "shared-cache"
    root.mkdir()
    if how == "writable by others":
        root.chmod(0o777)
    else:
        if os.getuid() != 0:
            pytest.skip("giving a folder to another user needs root")
        os.chown(root, 12345, 12345)
    monkeypatch.setenv("AOTC_CACHE_DIR", str(root))
    result = build(packages, tmp_path / "pkg")
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: build cache {root} is ") and how.split()[0] in line
    fix = f"chmod 700 {root}" if how == "writable by others" else "AOTC_CACHE_DIR"
    assert fix in line
    assert not (tmp_path / "pkg").exists()


def test_a_new_cache_is_created_private(packages, tmp_path, monkeypatch):
    monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / "new" / "cache"))
    from aotc.cache_dir import private_cache_root

    root = private_cache_root()
    assert root.stat().st_mode & 0o777 == 0o700
