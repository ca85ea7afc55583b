"""ONNX export and the ONNX Runtime backend. Round trips against eager (two inputs; a dynamic
batch at three sizes; a stateful model), the runtime's checks on such packages, the missing extra
and an operator the exporter cannot convert."""

from __future__ import annotations

import builtins
import json
import shutil

import pytest
import torch
from conftest import MLP, MODELS, eager_model, error_lines, invoke

import aotc_runtime

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.fixture(scope="module")
def onnx_packages(packages, tmp_path_factory):
    """two_input from an .onnx written by `aotc export --format onnx`; dynamic_mlp and counter from
    their .pt2 artifacts with --backend onnxruntime."""
    root = tmp_path_factory.mktemp("onnx")
    model = root / "two_input.onnx"
    result = invoke("export", MODELS / "two_input.py", "--format", "onnx", "-o", model)
    assert result.exit_code == 0, result.stderr
    built = {"two_input": root / "two_input_ort"}
    assert invoke("build", model, "-o", built["two_input"], "--quiet").exit_code == 0
    for name in ("dynamic_mlp", "counter"):
        built[name] = root / f"{name}_ort"
        result = invoke(
            "build",
            packages.get(name).artifact,
            "--backend",
            "onnxruntime",
            "-o",
            built[name],
            "--quiet",
        )
        assert result.exit_code == 0, result.stderr
    return built


def test_export_writes_a_checked_onnx_model_with_the_signature(tmp_path):
    import onnx

    out = tmp_path / "m.onnx"
    result = invoke("export", MLP, "--input-shape", "Bx128", "--dim", "B=1:64", "-o", out)
    assert result.exit_code == 0, result.stderr  # the format follows -o's suffix
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    props = {p.key: p.value for p in model.metadata_props}
    signature = json.loads(props["aotc.signature"])
    assert signature["dims"]["B"]["min"] == 1 and signature["dims"]["B"]["max"] == 64
    (x,) = model.graph.input
    assert x.name == "x" and x.type.tensor_type.shape.dim[0].dim_param == "B"
    assert max(json.loads(props["aotc.export_check"]).values()) < 1e-4  # against eager, at export


def test_two_inputs_round_trip(onnx_packages):
    package = aotc_runtime.load(onnx_packages["two_input"])
    manifest = package.manifest
    assert manifest.backend == "onnxruntime" and manifest.model_file == "model.onnx"
    assert manifest.backend_options["optimization_level"] == "all"
    assert manifest.backend_options["tied_to_hardware"] is True
    assert manifest.numeric_check.passed
    generator = torch.Generator().manual_seed(3)
    features, ids = torch.randn(8, 16, generator=generator), torch.randint(0, 100, (8, 5))
    with torch.no_grad():
        want = eager_model("two_input")(features, ids)
    got = package(features, ids=ids)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_dynamic_batch_at_three_sizes(onnx_packages):
    package = aotc_runtime.load(onnx_packages["dynamic_mlp"])
    model = eager_model("dynamic_mlp")
    for batch in (1, 33, 64):
        x = torch.randn(batch, 128)
        with torch.no_grad():
            torch.testing.assert_close(package(x), model(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(aotc_runtime.InputMismatchError, match="outside 1..64"):
        package(torch.randn(65, 128))


def test_state_is_carried_between_calls(onnx_packages):
    package = aotc_runtime.load(onnx_packages["counter"])
    x = torch.ones(2, 3)
    assert [package(x)[0, 0].item() for _ in range(3)] == [1.0, 2.0, 3.0]


def test_the_runtime_checks_apply(onnx_packages, tmp_path):
    """The manifest's hash and the model's embedded description guard ONNX packages too; the C++
    runner refuses them with the reason."""
    pkg = tmp_path / "pkg"
    shutil.copytree(onnx_packages["dynamic_mlp"], pkg)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["signature"]["dims"]["B"]["max"] = 128
    (pkg / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))
    result = invoke("run", pkg)
    assert (
        result.exit_code == 7
        and "signature.dims.B.max is 128 in the manifest but 64 in model.onnx" in result.stderr
    )
    result = invoke("run", onnx_packages["dynamic_mlp"], "--engine", "cpp")
    if "make runner" not in result.stderr:  # the runner is built by `make test`
        assert result.exit_code == 7 and "runs AOTInductor packages only" in result.stderr


def test_an_operator_onnx_lacks_is_one_line_naming_it(tmp_path):
    model = tmp_path / "histogram.py"
    model.write_text(
        "import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.histc(x, bins=4)\n\n\ndef get_model():\n    return M()\n"
    )
    result = invoke(
        "export", model, "--input-shape", "4x8", "--format", "onnx", "-o", tmp_path / "h.onnx"
    )
    assert result.exit_code == 4, result.stderr
    (line,) = error_lines(result.stderr)
    assert "cannot convert" in line and "histc" in line and f"{model}:6" in line
    assert len(line.splitlines()) == 1 and not (tmp_path / "h.onnx").exists()


def test_without_the_extra_a_clear_error(onnx_packages, packages, tmp_path, monkeypatch):
    real_import = builtins.__import__

    def without_onnxruntime(name, *args, **kwargs):
        if name.split(".")[0] == "onnxruntime":
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_onnxruntime)
    result = invoke("run", onnx_packages["two_input"])
    assert result.exit_code == 2 and "pip install onnxruntime==" in result.stderr, result.stderr
    result = invoke(
        "build", packages.get("mlp").artifact, "--backend", "onnxruntime", "-o", tmp_path / "p"
    )
    assert result.exit_code == 2 and "pip install 'aotc[onnx]'" in result.stderr, result.stderr
    assert not (tmp_path / "p").exists()


def test_inductor_settings_are_refused_for_onnxruntime(packages, tmp_path):
    artifact = packages.get("mlp").artifact
    result = invoke(
        "build",
        artifact,
        "--backend",
        "onnxruntime",
        "--mode",
        "max-autotune",
        "-o",
        tmp_path / "p",
    )
    assert result.exit_code == 2 and "Inductor mode" in result.stderr


def test_bench_times_onnxruntime_beside_the_package(packages, tmp_path):
    """`aotc bench --against onnxruntime`: the artifact built for ONNX Runtime, timed interleaved
    with the AOTInductor package, and its cold start in a fresh process."""
    out = tmp_path / "bench.json"
    result = invoke(
        "bench", packages.get("mlp").package, "--against", "onnxruntime",
        "--iters", 6, "--warmup", 1, "--rounds", 2, "--cold-runs", 1, "--json", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(out.read_text())
    assert [c["name"] for c in report["contenders"]] == ["package", "onnxruntime"]
    rows = {row["contender"]: row for row in report["results"]}
    assert rows["onnxruntime"]["latency"]["n"] == 6
    assert {entry["contender"] for entry in report["cold_start"]} == {"package", "onnxruntime"}


def test_verify_reruns_the_check_of_an_onnx_package(onnx_packages):
    result = invoke("verify", onnx_packages["two_input"])
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "numeric" in result.stdout and "verified" in result.stdout


def test_another_onnxruntime_release_is_refused(onnx_packages, tmp_path):
    """An optimized graph holds its ONNX Runtime release's fused operators: another release refuses it."""
    pkg = tmp_path / "pkg"
    shutil.copytree(onnx_packages["dynamic_mlp"], pkg)
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["backend_options"]["onnxruntime"] = "0.0.1"
    (pkg / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))
    result = invoke("run", pkg)
    assert result.exit_code == 7 and "was optimized by ONNX Runtime 0.0.1" in result.stderr


def test_an_optimization_failure_is_one_line_and_leaves_nothing(packages, tmp_path, monkeypatch):
    import onnxruntime

    real = onnxruntime.InferenceSession

    def failing_when_optimizing(model, options=None, **kwargs):
        if options is not None and options.optimized_model_filepath:
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : simulated\nsecond line")
        return real(model, options, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", failing_when_optimizing)
    out = tmp_path / "p"
    result = invoke("build", packages.get("mlp").artifact, "--backend", "onnxruntime", "-o", out)
    assert result.exit_code == 5, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert (
        line.startswith("error: ONNX Runtime could not optimize the model") and "simulated" in line
    )
    assert "second line" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no package, no staging folder
