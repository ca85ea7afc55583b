"""The C++ runner on packages with specialized members (manifest `specializations`).

The fixture is put together by hand from two builds of the same seeded model (examples/mlp.py):
the session's dynamic package (conftest's `dynamic_mlp`, B=1:64) and a static B=8 build copied in
as `specialized/B-8`, with the top manifest's `specializations` and `files` rewritten.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy
import pytest
import torch
from conftest import MLP, invoke
from test_cpp_runner import python_outputs, run_cpp

import aotc_runtime

MEMBER = "specialized/B-8"


def _write_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))


def _edit_top(package: Path, edit=lambda m: None) -> None:
    """Apply EDIT to the top manifest and rehash every file under it (members' included)."""

    def rehashed(manifest: dict) -> None:
        edit(manifest)
        manifest["files"] = aotc_runtime.hash_package_files(package)

    _write_manifest(package, rehashed)


@pytest.fixture(scope="session")
def specialized(packages, tmp_path_factory) -> Path:
    """The dynamic MLP package with a static B=8 member of the same weights."""
    root = tmp_path_factory.mktemp("specialized")
    artifact, static = root / "static.pt2", root / "static_pkg"
    result = invoke("export", MLP, "--input-shape", "8x128", "-o", artifact)
    assert result.exit_code == 0, result.stderr
    result = invoke(
        "build", artifact, "--device", "cpu", "--mode", "default", "-o", static, "--quiet"
    )
    assert result.exit_code == 0, result.stderr
    package = root / "pkg"
    shutil.copytree(packages.get("dynamic_mlp").package, package)
    shutil.copytree(static, package / MEMBER)
    top = json.loads((package / "manifest.json").read_text())["signature"]["inputs"]
    member = json.loads((static / "manifest.json").read_text())["signature"]["inputs"]
    # What the runtime requires of a member: the top inputs with B made static.
    assert [(s["name"], s["dtype"], [8 if d == "B" else d for d in s["shape"]]) for s in top] == [
        (s["name"], s["dtype"], s["shape"]) for s in member
    ]
    _edit_top(package, lambda m: m.update(specializations=[{"dims": {"B": 8}, "package": MEMBER}]))
    return package


def _run(runner, package: Path, tmp_path: Path, rows: int):
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
    numpy.save(tmp_path / "x.npy", x.numpy())
    result = run_cpp(
        runner, package, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npz", "--json"
    )
    return x, result


@pytest.mark.parametrize("rows, ran", [(8, MEMBER), (3, "model.pt2")])
def test_dispatch_by_batch_size(runner, packages, specialized, tmp_path, rows, ran):
    x, result = _run(runner, specialized, tmp_path, rows)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ran"] == ran
    # The dynamic package through the Python runtime: what the member must agree with.
    expected = python_outputs(packages.get("dynamic_mlp").package, [x])
    with numpy.load(tmp_path / "y.npz") as got:
        assert list(got.files) == list(expected)
        for name, want in expected.items():
            assert torch.allclose(torch.from_numpy(got[name]), want, atol=1e-5), name


def test_onnxruntime_member_is_skipped_with_a_note(runner, specialized, tmp_path):
    package = tmp_path / "pkg"
    shutil.copytree(specialized, package)
    _write_manifest(package / MEMBER, lambda m: m.update(backend="onnxruntime"))
    _edit_top(package)
    _, result = _run(runner, package, tmp_path, 8)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ran"] == "model.pt2"
    assert result.stderr.strip() == (
        f"note: {MEMBER} is an onnxruntime model; B=8 runs the dynamic model in the C++ runner"
    )


def _specializations(entry: dict):
    return lambda m: m.update(specializations=[entry])


def _member_dtype(package: Path) -> None:
    """The member's input dtype changed, its hash and the top's `files` redone: only the
    comparison with the top signature can tell."""
    _write_manifest(package / MEMBER, lambda m: m["signature"]["inputs"][0].update(dtype="float64"))


REFUSALS = {
    "unknown dim": (_specializations({"dims": {"C": 8}, "package": MEMBER}), "dims.C"),
    "value out of range": (_specializations({"dims": {"B": 65}, "package": MEMBER}), "dims.B"),
    "path with ..": (_specializations({"dims": {"B": 8}, "package": "../B-8"}), "package"),
    "absolute path": (_specializations({"dims": {"B": 8}, "package": "/tmp/B-8"}), "package"),
    "not a list": (lambda m: m.update(specializations={"B": 8}), "is not a list"),
    "stateful": (
        lambda m: m["signature"].update(state=[{"name": "s", "dtype": "float32", "shape": [1]}]),
        "state",
    ),
    "member signature": (_member_dtype, "signature.inputs[0].dtype is float64"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_specializations_are_refused(runner, specialized, tmp_path, case):
    edit, named = REFUSALS[case]
    package = tmp_path / "pkg"
    shutil.copytree(specialized, package)
    if case == "member signature":
        edit(package)
        _edit_top(package)
    else:
        _edit_top(package, edit)
    _, result = _run(runner, package, tmp_path, 8)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 7, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert named in lines[0] and "aotc build --force" in lines[0], lines[0]
