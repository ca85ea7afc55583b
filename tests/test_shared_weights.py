"""`aotc build --specialize`: the package and its members share one copy of the weights, on disk
and in memory (manifest `shared_weights`; aotc/compiler/shared_weights.py), in both runtimes."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import eager_model, invoke

import aotc_runtime

MEMBERS = ["specialized/B-1", "specialized/B-8"]


@pytest.fixture(scope="module")
def specialized(packages, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("shared") / "pkg"
    result = invoke(
        "build", packages.get("dynamic_mlp").artifact, "--device", "cpu", "-o", output,
        "--specialize", "B=1,8", "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return output


def weight_bytes(folder: Path) -> int:
    """Bytes of weights on disk: the shared file and every weights blob left in an archive."""
    total = sum(p.stat().st_size for p in folder.rglob("weights.pt"))
    for archive in folder.rglob("model.pt2"):
        with zipfile.ZipFile(archive) as zf:
            total += sum(i.file_size for i in zf.infolist() if i.filename.endswith("weights.blob"))
    return total


def test_the_weights_are_on_disk_once(specialized):
    manifest = json.loads((specialized / "manifest.json").read_text())
    assert manifest["shared_weights"] == {"file": "weights.pt", "programs": [".", *MEMBERS]}
    model = eager_model("dynamic_mlp")
    one_copy = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert weight_bytes(specialized) <= 1.05 * one_copy + 4096  # + torch.save's own framing
    for member in MEMBERS:
        with zipfile.ZipFile(specialized / member / "model.pt2") as zf:
            assert not any(n.endswith("weights.blob") for n in zf.namelist())


def test_every_program_answers_as_eager(specialized):
    package = aotc_runtime.load(specialized)
    model = eager_model("dynamic_mlp")
    for batch, runs in ((1, "specialized/B-1"), (3, "."), (8, "specialized/B-8")):
        x = torch.randn(batch, 128)
        assert package.route(x).path.relative_to(package.path).as_posix() == runs
        with torch.no_grad():
            torch.testing.assert_close(package(x), model(x), atol=1e-4, rtol=1e-4)


def test_verify_passes_on_the_shared_package(specialized):
    result = invoke("verify", specialized, "--json")
    assert result.exit_code == 0, result.output


def test_a_weights_file_changed_after_the_build_is_refused(specialized, tmp_path):
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(specialized, copy)
    weights = torch.load(copy / "weights.pt", weights_only=True)
    first = next(iter(weights))
    weights[first] = weights[first] + 1
    torch.save(weights, copy / "weights.pt")
    with pytest.raises(aotc_runtime.PackageError, match="weights.pt"):
        aotc_runtime.load(copy)


@pytest.mark.parametrize(
    "batch, ran", [(1, "specialized/B-1"), (3, "model.pt2"), (8, "specialized/B-8")]
)
def test_the_cpp_runner_reads_the_shared_weights(specialized, tmp_path, batch, ran):
    import numpy
    from conftest import built_runner
    from test_cpp_runner import run_cpp

    x = torch.randn(batch, 128)
    numpy.save(tmp_path / "x.npy", x.numpy())
    done = run_cpp(
        built_runner(),
        specialized,
        "--input",
        tmp_path / "x.npy",
        "--output",
        tmp_path / "y.npz",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ran"] == ran
    with torch.no_grad():
        expected = eager_model("dynamic_mlp")(x)
    got = torch.from_numpy(numpy.load(tmp_path / "y.npz")["output_0"])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_a_weights_file_whose_tensor_claims_more_than_it_holds_is_refused(specialized, tmp_path):
    """A crafted weights.pt (manifest rehashed, as an attacker who knows the format would): a
    tensor saved as one value expanded to a huge shape is a few bytes on disk; a program handed it
    would read past its end. Both runtimes refuse it before any program sees it (exit 7)."""
    import shutil

    from conftest import built_runner
    from test_cpp_runner import run_cpp

    from aotc.compiler.package_writer import write_manifest

    copy = tmp_path / "pkg"
    shutil.copytree(specialized, copy)
    weights = torch.load(copy / "weights.pt", weights_only=True)
    first = next(iter(weights))
    weights[first] = torch.zeros(1).expand(1 << 20, 1 << 20)  # claims 4 TiB
    torch.save(weights, copy / "weights.pt")
    write_manifest(copy, aotc_runtime.read_manifest(copy))
    assert (copy / "weights.pt").stat().st_size < 1 << 20
    with pytest.raises(aotc_runtime.PackageError, match="as a view, not a whole tensor"):
        aotc_runtime.load(copy)
    done = run_cpp(built_runner(), copy)
    assert done.returncode == 7 and "as a view, not a whole tensor" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
