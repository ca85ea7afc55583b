"""GPU round trips (marked gpu; skipped without CUDA). Packages are built once per session.

Set AOTC_GPU_WORKDIR to keep the built packages (the GPU benchmark reuses them).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import MLP, MODELS, eager_model, invoke

import aotc_runtime

pytestmark = pytest.mark.gpu
MODES = ("default", "reduce-overhead", "max-autotune")


@pytest.fixture(scope="session")
def gpu_workdir(tmp_path_factory) -> Path:
    root = os.environ.get("AOTC_GPU_WORKDIR")
    if root:
        Path(root).mkdir(parents=True, exist_ok=True)
        return Path(root)
    return tmp_path_factory.mktemp("gpu")


def export_once(workdir: Path, name: str, *args) -> Path:
    artifact = workdir / f"{name}.pt2"
    if not artifact.exists():
        result = invoke("export", *args, "-o", artifact)
        assert result.exit_code == 0, result.stderr
    return artifact


def build_once(workdir: Path, artifact: Path, name: str, *flags) -> Path:
    package = workdir / name
    if not (package / "manifest.json").exists():
        result = invoke(
            "build", artifact, "--device", "cuda", "-o", package, "--quiet", "--force", *flags
        )
        assert result.exit_code == 0, result.stderr
    return package


@pytest.fixture(scope="session")
def densenet(gpu_workdir):
    pytest.importorskip("torchvision")
    artifact = export_once(
        gpu_workdir,
        "densenet121",
        "torchvision.models:densenet121",
        "--input-shape",
        "16x3x128x128",
    )
    return artifact


@pytest.mark.parametrize("mode", MODES)
def test_densenet121_round_trip(gpu_workdir, densenet, mode):
    import torchvision

    package_dir = build_once(gpu_workdir, densenet, f"densenet121_{mode}", "--mode", mode)
    package = aotc_runtime.load(package_dir)
    manifest = package.manifest
    assert manifest.device.type == "cuda" and manifest.device.compute_capability
    assert (
        manifest.toolchain.cuda
        and manifest.toolchain.build_tools["triton"]
        and manifest.toolchain.build_tools["ptxas"]
    )
    assert manifest.numeric_check.passed
    assert manifest.runtime.cuda_graphs == (mode != "default")
    torch.manual_seed(0)
    model = torchvision.models.densenet121().eval().cuda()
    for seed in (1, 2):  # two different inputs: a CUDA-graph replay must see the new values
        x = torch.randn(
            16, 3, 128, 128, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)
        )
        with torch.no_grad():
            torch.testing.assert_close(package(x), model(x), atol=2e-3, rtol=2e-3)
    if mode != "default":
        assert package.cuda_graphs_captured == 1
        first, second = package(x), package(x)
        # fresh outputs by default: a caller may keep them
        assert first.data_ptr() != second.data_ptr()


def test_reuse_outputs_returns_the_graph_buffers(gpu_workdir, densenet):
    import torchvision

    package = aotc_runtime.load(
        build_once(
            gpu_workdir, densenet, "densenet121_reduce-overhead", "--mode", "reduce-overhead"
        ),
        reuse_outputs=True,
    )
    torch.manual_seed(0)
    model = torchvision.models.densenet121().eval().cuda()
    x1, x2 = (
        torch.randn(16, 3, 128, 128, device="cuda"),
        torch.randn(16, 3, 128, 128, device="cuda"),
    )
    out1 = package(x1)
    kept = out1.clone()
    out2 = package(x2)
    # the same static buffer, overwritten by the second call
    assert out1.data_ptr() == out2.data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(kept, model(x1), atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(out2, model(x2), atol=2e-3, rtol=2e-3)


def test_dynamic_batch_on_gpu(gpu_workdir):
    artifact = export_once(gpu_workdir, "mlp_dyn", MLP, "--input-shape", "Bx128", "--dim", "B=1:64")
    package = aotc_runtime.load(
        build_once(gpu_workdir, artifact, "mlp_dyn_ro", "--mode", "reduce-overhead")
    )
    model = eager_model("dynamic_mlp").cuda()
    for batch in (1, 33, 64):
        x = torch.randn(batch, 128, device="cuda")
        with torch.no_grad():
            torch.testing.assert_close(package(x), model(x), atol=1e-4, rtol=1e-4)
    assert package.cuda_graphs_captured == 3  # one graph per static input shape
    with pytest.raises(aotc_runtime.InputMismatchError, match="outside 1..64"):
        package(torch.randn(65, 128, device="cuda"))


def test_two_inputs_on_gpu(gpu_workdir):
    artifact = export_once(gpu_workdir, "two_input", MODELS / "two_input.py")
    package = aotc_runtime.load(build_once(gpu_workdir, artifact, "two_input_cuda"))
    model = eager_model("two_input").cuda()
    features, ids = torch.randn(8, 16, device="cuda"), torch.randint(0, 100, (8, 5), device="cuda")
    with torch.no_grad():
        for got, want in zip(package(features, ids), model(features, ids)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("precision", ["bf16", "fp16", "tf32"])
def test_reduced_precision_package(gpu_workdir, precision):
    from aotc.compiler.tolerances import DEFAULTS

    artifact = export_once(
        gpu_workdir, "cnn_bn", MODELS / "cnn_bn.py", "--input-shape", "16x3x128x128"
    )
    package = aotc_runtime.load(
        build_once(gpu_workdir, artifact, f"cnn_{precision}", "--precision", precision)
    )
    tol = DEFAULTS[precision][0]
    assert package.manifest.precision == precision
    assert package.manifest.numeric_check.atol == tol and package.manifest.numeric_check.passed
    x = torch.randn(16, 3, 128, 128, device="cuda")
    out = package(x)
    assert out.dtype == torch.float32  # the signature the user exported is kept
    with torch.no_grad():
        torch.testing.assert_close(out, eager_model("cnn_bn").cuda()(x), atol=tol, rtol=tol)


def test_other_gpu_architecture_is_refused(gpu_workdir, tmp_path):
    artifact = export_once(gpu_workdir, "two_input", MODELS / "two_input.py")
    source = build_once(gpu_workdir, artifact, "two_input_cuda")
    copy = tmp_path / "pkg"
    shutil.copytree(source, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["device"]["compute_capability"] = "8.0"
    manifest["device"]["gpu_name"] = "NVIDIA A100"
    (copy / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))
    result = invoke("run", copy)
    assert result.exit_code == 7
    assert "built for NVIDIA A100 (compute capability 8.0)" in result.stderr


def test_without_bsymbolic_a_crash_is_a_clear_error(gpu_workdir, tmp_path):
    """On machines where the unpatched .so crashes on load, build says so (exit 5) instead of dying."""
    artifact = export_once(gpu_workdir, "two_input", MODELS / "two_input.py")
    result = invoke(
        "build", artifact, "--device", "cuda", "--no-bsymbolic", "-o", tmp_path / "pkg", "--quiet"
    )
    if result.exit_code == 5:
        assert "crashed when loaded" in result.stderr and "Bsymbolic" in result.stderr
        assert not (tmp_path / "pkg").exists()
    else:
        assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("mode", MODES)
def test_densenet121_through_the_cpp_runner(gpu_workdir, densenet, mode, tmp_path):
    """The C++ runner on each mode's package: the Python runtime's outputs, a CUDA graph replayed
    for reduce-overhead and max-autotune (fresh outputs: two inputs, two answers)."""
    import subprocess

    import numpy

    from aotc.deploy.cpp_runner import build_runner

    runner = build_runner(gpu_workdir / "runner_build")
    package_dir = build_once(gpu_workdir, densenet, f"densenet121_{mode}", "--mode", mode)
    package = aotc_runtime.load(package_dir)
    for seed in (1, 2):
        x = torch.randn(16, 3, 128, 128, generator=torch.Generator().manual_seed(seed))
        numpy.save(tmp_path / "x.npy", x.numpy())
        result = subprocess.run(
            [
                str(runner),
                str(package_dir),
                "--input",
                str(tmp_path / "x.npy"),
                "--output",
                str(tmp_path / "y.npz"),
                "--iters",
                "3",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["cuda_graphs_captured"] == (1 if mode != "default" else 0)
        with torch.no_grad():
            want = package(x.cuda()).cpu()
        got = torch.from_numpy(numpy.load(tmp_path / "y.npz")["output_0"])
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_eight_threads_share_a_cuda_package(gpu_workdir, mode):
    """On the GPU: a CUDA-graph package replays into static buffers, so its calls serialize (and
    order themselves across the callers' streams); every caller must still get its own answer, with
    batch sizes differing per thread (one graph each)."""
    from test_concurrency import CALLS, THREADS, call_from_threads

    artifact = export_once(gpu_workdir, "mlp_dyn", MLP, "--input-shape", "Bx128", "--dim", "B=1:64")
    folder = build_once(gpu_workdir, artifact, f"mlp_dyn_{mode}", "--mode", mode)
    package = aotc_runtime.load(folder, threads=THREADS)
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [
        [(torch.randn(1 + index * 7, 128, device="cuda", generator=generator),) for _ in range(2)]
        for index in range(THREADS)
    ]
    with torch.inference_mode():
        expected = [[package(*x).clone() for x in per_thread] for per_thread in inputs]
    outputs = call_from_threads(package, lambda index: inputs[index])
    torch.cuda.synchronize()
    for index, per_thread in enumerate(outputs):
        assert len(per_thread) == CALLS
        for call, out in enumerate(per_thread):
            assert torch.equal(out, expected[index][call % 2]), (mode, index, call)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_reloading_a_cuda_package_returns_its_gpu_memory(gpu_workdir, mode):
    """On the GPU: each capture's warm-up once ran on a new CUDA stream, and AOTInductor keeps
    33 MiB for every stream a model ran on: +33 MiB of GPU memory per reload."""
    from aotc.bench.soak import load_unload_cycles

    artifact = export_once(gpu_workdir, "mlp_dyn", MLP, "--input-shape", "Bx128", "--dim", "B=1:64")
    folder = build_once(gpu_workdir, artifact, f"mlp_dyn_{mode}", "--mode", mode)
    report = load_unload_cycles(folder, cycles=20)
    assert report["per_cycle_mib"]["cuda_allocated"] < 1, report


def test_tuned_specialized_cuda_package(gpu_workdir, monkeypatch):
    """--tune --specialize on CUDA, reduce-overhead: each size runs its member with its own CUDA
    graph, every model matches eager (fp32, TF32 off on both sides), and cuDNN's benchmark flag
    is on only inside the package's calls."""
    monkeypatch.setenv("AOTC_CACHE_DIR", str(gpu_workdir / "tune-cache"))
    artifact = export_once(
        gpu_workdir,
        "cnn_dyn",
        MODELS / "cnn_bn.py",
        "--input-shape",
        "Bx3x64x64",
        "--dim",
        "B=1:16",
    )
    folder = build_once(
        gpu_workdir, artifact, "cnn_tuned", "--mode", "reduce-overhead", "--tune",
        "--tune-candidates", "freezing", "--specialize", "B=1,8", "--tune-jobs", "6",
    )  # fmt: skip
    tuning = json.loads((folder / "manifest.json").read_text())["tuning"]
    assert tuning["dropped"] == []
    for variant in tuning["variants"]:
        assert [c["name"] for c in variant["candidates"]] == ["inductor", "freezing"]
        # a model with convolutions is timed both ways; the manifest says which was kept
        assert all("cudnn_benchmark" in c for c in variant["candidates"]), variant["candidates"]
        chosen = next(c for c in variant["candidates"] if c["status"] == "chosen")
        member = json.loads((folder / variant["package"] / "manifest.json").read_text())
        assert member["runtime"].get("cudnn_benchmark", False) == chosen["cudnn_benchmark"]
    package = aotc_runtime.load(folder)
    model = eager_model("cnn_bn").cuda()
    torch.backends.cudnn.benchmark = False
    for batch, runs in ((1, "specialized/B-1"), (8, "specialized/B-8"), (5, ".")):
        x = torch.randn(batch, 3, 64, 64, device="cuda")
        assert package.route(x).path.relative_to(package.path).as_posix() == runs
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            expected = model(x)
        torch.testing.assert_close(package(x), expected, atol=1e-4, rtol=1e-4)
        assert torch.backends.cudnn.benchmark is False  # put back after the call
    assert package.cuda_graphs_captured == 3  # one per member and size
