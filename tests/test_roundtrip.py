"""export -> build -> run on CPU for every test model, compared with eager PyTorch."""

import json

import numpy
import pytest
import torch
from conftest import MLP, MODELS, eager_model, invoke

import aotc_runtime

INPUTS = {
    "mlp": lambda g: [torch.randn(32, 128, generator=g)],
    "feature_pyramid": lambda g: [torch.randn(1, 3, 224, 224, generator=g)],
    "sincos": lambda g: [torch.randn(10, 10, generator=g), torch.randn(10, 10, generator=g)],
    "cnn_bn": lambda g: [torch.randn(16, 3, 128, 128, generator=g)],
    "two_input": lambda g: [
        torch.randn(8, 16, generator=g),
        torch.randint(0, 100, (8, 5), generator=g),
    ],
}


def as_list(out):
    return [out] if isinstance(out, torch.Tensor) else list(out)


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_package_matches_eager(packages, name):
    built = packages.get(name)
    package = aotc_runtime.load(built.package)
    inputs = INPUTS[name](torch.Generator().manual_seed(123))
    with torch.no_grad():
        expected = as_list(eager_model(name)(*inputs))
        got = as_list(package(*inputs))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    check = package.manifest.numeric_check.to_json()
    assert check["passed"] and all(
        o["max_abs"] <= o["atol"] + 1e-12 or o["ok"] for o in check["outputs"]
    )


def test_cli_run_on_mlp_matches_eager_within_1e5(packages, tmp_path):
    built = packages.get("mlp")
    x = numpy.random.default_rng(7).standard_normal((32, 128), dtype=numpy.float32)
    numpy.save(tmp_path / "x.npy", x)
    result = invoke(
        "run",
        built.package,
        "--input",
        tmp_path / "x.npy",
        "--output",
        tmp_path / "y.npz",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["outputs"] == [{"name": "output_0", "shape": [32, 10], "dtype": "float32"}]
    got = torch.from_numpy(numpy.load(tmp_path / "y.npz")["output_0"])
    with torch.no_grad():
        expected = eager_model("mlp")(torch.from_numpy(x))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_cli_run_two_inputs_from_npz_and_pt(packages, tmp_path):
    built = packages.get("two_input")
    g = torch.Generator().manual_seed(5)
    features, ids = torch.randn(8, 16, generator=g), torch.randint(0, 100, (8, 5), generator=g)
    numpy.savez(tmp_path / "in.npz", features=features.numpy(), ids=ids.numpy())
    torch.save([features, ids], tmp_path / "in.pt")
    with torch.no_grad():
        expected = eager_model("two_input")(features, ids)
    for source, out in (("in.npz", "out.npz"), ("in.pt", "out.pt")):
        result = invoke(
            "run", built.package, "--input", tmp_path / source, "--output", tmp_path / out
        )
        assert result.exit_code == 0, result.stderr
    npz = numpy.load(tmp_path / "out.npz")
    assert sorted(npz.files) == ["output_0", "output_1"]
    pt = torch.load(tmp_path / "out.pt")
    for index, want in enumerate(expected):
        torch.testing.assert_close(
            torch.from_numpy(npz[f"output_{index}"]), want, atol=1e-4, rtol=1e-4
        )
        torch.testing.assert_close(pt[f"output_{index}"], want, atol=1e-4, rtol=1e-4)


def test_cli_run_reports_latency_percentiles(packages):
    result = invoke("run", packages.get("sincos").package, "--iters", "20", "--json")
    assert result.exit_code == 0, result.stderr
    latency = json.loads(result.stdout)["latency"]
    assert latency["n"] == 20
    assert latency["min_ms"] <= latency["median_ms"] <= latency["p90_ms"] <= latency["p99_ms"]


def test_dynamic_batch_runs_inside_range_and_refuses_outside(packages):
    built = packages.get("dynamic_mlp")
    package = aotc_runtime.load(built.package)
    assert package.signature.dims["B"]["min"] == 1 and package.signature.dims["B"]["max"] == 64
    model = eager_model("dynamic_mlp")
    for batch in (1, 17, 64):
        x = torch.randn(batch, 128)
        with torch.no_grad():
            torch.testing.assert_close(package(x), model(x), atol=1e-4, rtol=1e-4)
    with pytest.raises(aotc_runtime.InputMismatchError, match=r"dim 0 \(B\) = 65 is outside 1..64"):
        package(torch.randn(65, 128))
    labels = " ".join(package.manifest.numeric_check.cases)
    assert "B=1" in labels and "B=64" in labels


def test_export_records_signature_with_dynamic_ranges(packages):
    manifest = aotc_runtime.load(packages.get("dynamic_mlp").package).manifest
    signature = manifest.signature.to_json()
    assert signature["inputs"][0]["shape"] == ["B", 128]
    assert signature["outputs"][0]["shape"] == ["B", 10]
    assert signature["dims"] == {"B": {"min": 1, "max": 64, "example": 16}}


def test_import_path_target(tmp_path, monkeypatch):
    """MODEL as package.module:attr (here a module on sys.path; torchvision works the same way)."""
    monkeypatch.syspath_prepend(str(MODELS))
    result = invoke(
        "export",
        "feature_pyramid:FeaturePyramid",
        "--input-shape",
        "2x3x32x32",
        "-o",
        tmp_path / "fp.pt2",
    )
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "fp.pt2").is_file()


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_weights_are_loaded_before_export(tmp_path, suffix):
    torch.manual_seed(99)
    from importlib import util

    spec = util.spec_from_file_location("mlp_for_weights", MLP)
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trained = module.SimpleModel()
    weights = tmp_path / f"w{suffix}"
    if suffix == ".pt":
        torch.save(trained.state_dict(), weights)
    else:
        from safetensors.torch import save_file

        save_file(trained.state_dict(), str(weights))
    result = invoke(
        "export", MLP, "--input-shape", "4x128", "--weights", weights, "-o", tmp_path / "w.pt2"
    )
    assert result.exit_code == 0, result.stderr
    ep = torch.export.load(str(tmp_path / "w.pt2"))
    x = torch.randn(4, 128)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), trained.eval()(x))


def test_weights_that_do_not_fit_are_refused(tmp_path):
    torch.save({"fc1.weight": torch.zeros(3, 3)}, tmp_path / "bad.pt")
    result = invoke(
        "export",
        MLP,
        "--input-shape",
        "4x128",
        "--weights",
        tmp_path / "bad.pt",
        "-o",
        tmp_path / "w.pt2",
    )
    assert (
        result.exit_code == 2
        and "does not fit the model" in result.stderr
        and "Traceback" not in result.stderr
    )
    assert not (tmp_path / "w.pt2").exists()
