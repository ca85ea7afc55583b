"""The thin runtime: refusals (damaged packages, version mismatch, wrong inputs) and its import boundary."""

import contextlib
import json
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch
from conftest import invoke

import aotc_runtime


def copy_package(packages, tmp_path, name="mlp"):
    target = tmp_path / "pkg"
    shutil.copytree(packages.get(name).package, target)
    return target


def test_missing_file_is_refused(packages, tmp_path):
    pkg = copy_package(packages, tmp_path)
    (pkg / "model.pt2").unlink()
    result = invoke("run", pkg)
    assert result.exit_code == 7
    assert "model.pt2 is missing" in result.stderr and "Traceback" not in result.stderr


def test_edited_file_is_refused(packages, tmp_path):
    pkg = copy_package(packages, tmp_path)
    with open(pkg / "model.pt2", "r+b") as handle:
        handle.seek(100)
        handle.write(b"\x00\x01\x02")
    result = invoke("run", pkg)
    assert result.exit_code == 7
    assert "model.pt2 was modified" in result.stderr and "--force" in result.stderr


def test_missing_manifest_is_refused(packages, tmp_path):
    pkg = copy_package(packages, tmp_path)
    (pkg / "manifest.json").unlink()
    result = invoke("run", pkg)
    assert result.exit_code == 7 and "has no manifest.json" in result.stderr


def _edit_manifest(pkg, edit):
    """Edit a manifest the way someone who knows the format would: its own hash recomputed."""
    manifest = json.loads((pkg / "manifest.json").read_text())
    edit(manifest)
    (pkg / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda m: m.pop("precision"), "precision is missing"),
        (lambda m: m.update(device="cpu"), "device is not an object"),
        (lambda m: m["device"].update(type="tpu"), "device.type is 'tpu', not one of cpu, cuda"),
        (lambda m: m.update(files={}), "files does not list model.pt2"),
        (lambda m: m["toolchain"].update(torch=2), "toolchain.torch is not a string"),
        (lambda m: m.pop("runtime"), "runtime is missing"),
        (lambda m: m["runtime"].update(tf32="yes"), "runtime.tf32 is not true or false"),
        (
            lambda m: m["numeric_check"].update(passed=None),
            "numeric_check.passed is not true or false",
        ),
        (lambda m: m["signature"].update(inputs="x"), "signature.inputs is not a list"),
        (
            lambda m: m["signature"]["inputs"][0].update(dtype="complex32"),
            "signature.inputs[0].dtype is 'complex32', not one of",
        ),
        (
            lambda m: m["signature"]["inputs"][0].update(shape=[32, None]),
            "signature.inputs[0].shape is not a list of sizes",
        ),
        (
            lambda m: m["signature"]["inputs"][0].update(shape=["B", 128]),
            "name dims with no range in signature.dims: B",
        ),
        (
            lambda m: m["signature"].update(dims={"B": {"min": 8, "max": 4, "example": 6}}),
            "signature.dims.B range is not min <= example <= max",
        ),
    ],
)
def test_malformed_manifest_is_a_package_error(packages, tmp_path, edit, fragment):
    """A hand-edited manifest is refused as a package (exit 7) naming the field, never an internal error."""
    pkg = copy_package(packages, tmp_path)
    _edit_manifest(pkg, edit)
    result = invoke("run", pkg)
    assert result.exit_code == 7, result.stderr
    assert (
        fragment in result.stderr
        and "internal error" not in result.stderr
        and "Traceback" not in result.stderr
    )


def test_deeply_nested_manifest_is_a_package_error(packages, tmp_path):
    """JSON nested past the parser's recursion limit is a package error too, not an internal one."""
    pkg = copy_package(packages, tmp_path)
    (pkg / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    result = invoke("run", pkg)
    assert result.exit_code == 7 and "is not valid JSON" in result.stderr, result.stderr


def test_other_torch_version_is_refused(packages, tmp_path):
    pkg = copy_package(packages, tmp_path)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["toolchain"]["torch"] = "2.11.0+cu130"
    (pkg / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))
    result = invoke("run", pkg)
    assert result.exit_code == 7
    assert (
        "built with torch 2.11.0+cu130" in result.stderr
        and f"runs torch {torch.__version__}" in result.stderr
    )


def test_cuda_package_refused_without_gpu(packages, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    pkg = copy_package(packages, tmp_path)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["device"] = {
        "type": "cuda",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "compute_capability": "9.0",
    }
    (pkg / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))
    result = invoke("run", pkg)
    assert result.exit_code == 7 and "no usable GPU" in result.stderr


@pytest.mark.parametrize(
    "make_inputs, fragment",
    [
        (lambda: [torch.randn(32, 128), torch.randn(1)], "takes 1 input(s) (x), 2 given"),
        (
            lambda: [torch.randn(32, 128, dtype=torch.float64)],
            "input 'x' (#0) must be float32, got float64",
        ),
        (lambda: [torch.randn(32, 128, 1)], "must have 2 dims [32, 128], got 3 dims [32, 128, 1]"),
        (
            lambda: [torch.randn(31, 128)],
            "must have shape [32, 128], got [31, 128]: dim 0 is static 32",
        ),
    ],
)
def test_wrong_inputs_are_refused(packages, make_inputs, fragment):
    package = aotc_runtime.load(packages.get("mlp").package)
    # a good call first: remembered signatures must not let bad ones through
    package(torch.randn(32, 128))
    with pytest.raises(aotc_runtime.InputMismatchError) as info:
        package(*make_inputs())
    assert fragment in str(info.value)


def test_a_view_input_is_read_as_its_values(packages):
    """A non-contiguous input (a transposed copy's view) gives what its contiguous copy gives: the
    compiled model reads inputs with the strides it was compiled for."""
    package = aotc_runtime.load(packages.get("mlp").package)
    x = torch.randn(128, 32).t()
    assert not x.is_contiguous()
    torch.testing.assert_close(package(x), package(x.contiguous()), rtol=0, atol=0)


def test_wrong_input_file_through_cli(packages, tmp_path):
    import numpy

    numpy.save(tmp_path / "bad.npy", numpy.zeros((3, 3), dtype=numpy.float32))
    result = invoke("run", packages.get("mlp").package, "--input", tmp_path / "bad.npy")
    assert result.exit_code == 8
    assert "input 'x' (#0) must have shape [32, 128], got [3, 3]" in result.stderr
    result = invoke("run", packages.get("mlp").package, "--input", tmp_path / "missing.npy")
    assert result.exit_code == 8 and "does not exist" in result.stderr


def test_not_a_package(tmp_path):
    result = invoke("run", tmp_path / "nothing")
    assert result.exit_code == 7 and "does not exist" in result.stderr


def test_runtime_imports_neither_aotc_nor_compiler_side(packages):
    """Load and run in a fresh process: no aotc, click, yaml or torch._inductor gets imported."""
    code = (
        "import sys, torch, aotc_runtime\n"
        f"p = aotc_runtime.load({str(packages.get('mlp').package)!r})\n"
        "p(torch.randn(32, 128))\n"
        "bad = [m for m in ('aotc', 'click', 'yaml', 'torch._inductor') if m in sys.modules]\n"
        "print(','.join(bad) or 'clean')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "clean"


def test_runtime_source_never_imports_aotc():
    import pathlib
    import re

    root = pathlib.Path(aotc_runtime.__file__).parent
    for path in root.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+(aotc|click|yaml)\b", text, re.M), path


def test_model_so_is_linked_bsymbolic(packages, tmp_path):
    """The deliberate -Wl,-Bsymbolic link (aotc/compiler/toolchain.py) reaches the compiled model."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf not installed")
    with zipfile.ZipFile(packages.get("mlp").package / "model.pt2") as archive:
        names = [n for n in archive.namelist() if n.endswith(".so")]
        assert names
        archive.extract(names[0], tmp_path)
    dynamic = subprocess.run(
        [readelf, "-d", str(tmp_path / names[0])], capture_output=True, text=True, check=True
    ).stdout
    assert "SYMBOLIC" in dynamic
    manifest = aotc_runtime.load(packages.get("mlp").package).manifest
    assert manifest.toolchain.build_tools["link_flags"] == ["-Wl,-Bsymbolic"]


def test_python_module_runner(packages):
    out = subprocess.run(
        [sys.executable, "-m", "aotc_runtime", str(packages.get("sincos").package), "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)["outputs"][0]["shape"] == [10, 10]


def test_tf32_package_sets_tf32_around_its_calls_only(packages, tmp_path, monkeypatch):
    """A tf32 package runs with TF32 on, and leaves the process's flags as it found them."""
    # A CPU machine cannot build a tf32 package (CUDA only): this one is a CPU package whose manifest
    # says tf32, so the check that the manifest describes the compiled model is switched off here.
    monkeypatch.setattr("aotc_runtime.package.check_contract", lambda *args: None)
    package_dir = copy_package(packages, tmp_path)
    manifest_path = package_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    # what a --precision tf32 build records (CUDA only; the flags exist on CPU too)
    manifest["runtime"]["tf32"] = True
    manifest_path.write_text(aotc_runtime.hashed_manifest_text(manifest))
    flags = lambda: (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)  # noqa: E731
    before = flags()
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        package = aotc_runtime.load(package_dir)
        assert flags() == (False, False)
        seen = []
        settings = package.run_settings

        @contextlib.contextmanager
        def spy():  # the flags as the call saw them, at the end of its block
            with settings():
                yield
                seen.append(flags())

        package.run_settings = spy
        package(torch.randn(32, 128))
        assert seen == [(True, True)] and flags() == (False, False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_manifest_schema_catches_a_bad_field(packages):
    """The schema the tests hold every built package to is not vacuous."""
    from conftest import manifest_problems

    manifest = json.loads((packages.get("mlp").package / "manifest.json").read_text())
    assert manifest_problems(manifest) == []
    manifest["signature"]["output_structure"] = "blob"
    manifest["device"]["type"] = "tpu"
    del manifest["files"]["model.pt2"]
    problems = manifest_problems(manifest)
    assert any(p.startswith("signature/output_structure:") for p in problems)
    assert any(p.startswith("device/type:") for p in problems)
    assert any(p.startswith("files:") for p in problems)


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (
            lambda m: m["files"].update({"../outside.bin": "0" * 64}),
            "'../outside.bin', which is not a plain path inside",
        ),
        (
            lambda m: m["files"].update({"/etc/passwd": "0" * 64}),
            "'/etc/passwd', which is not a plain path inside",
        ),
        (
            lambda m: m["signature"].update(dims={"B": {"min": 1, "max": 10**12, "example": 8}}),
            "above the largest size",
        ),
        (
            lambda m: m["signature"]["inputs"][0].update(shape=[2**31, 128]),
            "is not a list of sizes",
        ),
        (
            lambda m: m["signature"]["inputs"][0].update(shape=[2**20, 2**20]),
            "above the runtime's bound of 2**32",
        ),
    ],
)
def test_manifest_cannot_reach_outside_or_declare_absurd_sizes(packages, tmp_path, edit, fragment):
    pkg = copy_package(packages, tmp_path)
    _edit_manifest(pkg, edit)
    result = invoke("run", pkg)
    assert result.exit_code == 7 and fragment in result.stderr, result.stderr


def test_links_and_unlisted_files_are_refused(packages, tmp_path):
    pkg = copy_package(packages, tmp_path)
    (pkg / "extra.txt").write_text("not built by aotc")
    result = invoke("run", pkg)
    assert result.exit_code == 7 and "extra.txt is not listed in the manifest" in result.stderr
    (pkg / "extra.txt").unlink()
    model = pkg / "model.pt2"
    real = tmp_path / "elsewhere.pt2"
    model.rename(real)
    model.symlink_to(real)  # same bytes, same hash: still refused, a link can point anywhere
    result = invoke("run", pkg)
    assert result.exit_code == 7 and "model.pt2 is a symbolic link" in result.stderr


def test_oversized_manifest_is_refused_before_parsing(packages, tmp_path):
    pkg = copy_package(packages, tmp_path)
    (pkg / "manifest.json").write_text(" " * (17 << 20) + "{}")
    result = invoke("run", pkg)
    assert result.exit_code == 7 and "above the 16 MiB a manifest may have" in result.stderr


def test_an_unfinished_package_is_refused(packages, tmp_path):
    """A build killed during its numeric check leaves a manifest with the check pending: not a package."""
    pkg = copy_package(packages, tmp_path)
    _edit_manifest(pkg, lambda m: m.update(numeric_check={"status": "pending"}))
    result = invoke("run", pkg)
    assert result.exit_code == 7 and "was never finished" in result.stderr


def test_a_manifest_edited_after_the_build_is_refused(packages, tmp_path):
    """manifest.json is covered by a hash of its own content."""
    pkg = copy_package(packages, tmp_path)
    path = pkg / "manifest.json"
    path.write_text(path.read_text().replace('"mode": "default"', '"mode": "max-autotune"'))
    result = invoke("run", pkg)
    assert result.exit_code == 7 and "manifest.json was modified after the build" in result.stderr


@pytest.mark.parametrize("format_version", [3, 2])
def test_a_manifest_that_lies_about_its_model_is_refused(packages, tmp_path, format_version):
    """A manifest declaring shape 48 for a model compiled for 32 ran with rows 32-47 wrong. Its
    hash recomputed (anyone can), or posing as a format-2 manifest that has no hash, it is still
    refused: the compiled model carries what it was built as."""
    pkg = copy_package(packages, tmp_path)

    def lie(manifest):
        manifest["signature"]["inputs"][0]["shape"] = [48, 128]
        manifest["format_version"] = format_version

    _edit_manifest(pkg, lie)
    result = invoke("run", pkg)
    assert result.exit_code == 7, result.stderr
    assert "signature.inputs[0].shape[0] is 48 in the manifest but 32 in model.pt2" in result.stderr


def test_a_swapped_model_is_refused(packages, tmp_path):
    """model.pt2 replaced by another model of the same signature, its hash updated."""
    other = tmp_path / "other.py"
    other.write_text(
        "import torch\n\n\nclass Other(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = torch.nn.Linear(128, 10)\n\n"
        "    def forward(self, x):\n        return self.fc(x)\n\n\n"
        "def get_model():\n    return Other()\n"
    )
    assert (
        invoke("export", other, "--input-shape", "32x128", "-o", tmp_path / "o.pt2").exit_code == 0
    )
    result = invoke(
        "build", tmp_path / "o.pt2", "--device", "cpu", "-o", tmp_path / "o_pkg", "--quiet"
    )
    assert result.exit_code == 0, result.stderr
    pkg = copy_package(packages, tmp_path)
    shutil.copy(tmp_path / "o_pkg" / "model.pt2", pkg / "model.pt2")
    digest = aotc_runtime.sha256_file(pkg / "model.pt2")
    _edit_manifest(pkg, lambda m: m["files"].update({"model.pt2": digest}))
    result = invoke("run", pkg)
    assert result.exit_code == 7, result.stderr
    assert "source_sha256 is" in result.stderr and "in model.pt2" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
