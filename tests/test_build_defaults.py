"""aotc build's defaults: the package folder beside the artifact, --device auto, indexed CUDA
devices in the placed graph, and a missing optional dependency as one line naming its extra."""

import json
import shutil
import sys
import textwrap

import pytest
import torch
from conftest import MODELS, invoke

import aotc.api
from aotc.config import BuildConfig, default_package_folder, resolve_device
from aotc.errors import UserInputError
from aotc.export.placement import move_program, name_graph_devices, target_device
from aotc.optional import require

NO_GPU = not torch.cuda.is_available()
PLOT_ERROR = "error: --plot needs matplotlib, which is not installed; pip install 'aotc[bench]'"


@pytest.fixture(scope="module")
def default_build(packages, tmp_path_factory):
    """`aotc build demo_out/mlp.pt2` with no -o and no --device, run from the folder above demo_out (one build)."""
    root = tmp_path_factory.mktemp("defaults")
    (root / "demo_out").mkdir()
    shutil.copy(packages.get("mlp").artifact, root / "demo_out" / "mlp.pt2")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        result = invoke("build", "demo_out/mlp.pt2")
    return root, result


def test_build_without_output_writes_beside_the_artifact(default_build):
    root, result = default_build
    assert result.exit_code == 0, result.stderr
    assert (root / "demo_out" / "mlp_pkg" / "manifest.json").is_file()
    assert not [p.name for p in (root / "demo_out").iterdir() if ".aotc-" in p.name]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("built demo_out/mlp_pkg (default, auto -> ")
    assert lines[-1] == "run it: aotc run demo_out/mlp_pkg/"
    assert default_package_folder(root / "a" / "resnet.v2.pt2") == root / "a" / "resnet.v2_pkg"


def test_the_printed_run_line_works(default_build, monkeypatch):
    root, result = default_build
    assert result.exit_code == 0, result.stderr
    command = result.stdout.strip().splitlines()[-1].removeprefix("run it: aotc ").split()
    monkeypatch.chdir(root)
    ran = invoke(*command)
    assert ran.exit_code == 0, ran.stderr
    assert "output_0" in ran.stdout


def test_default_folder_is_not_replaced_without_force(default_build, monkeypatch):
    root, result = default_build
    assert result.exit_code == 0, result.stderr
    before = (root / "demo_out" / "mlp_pkg" / "manifest.json").read_text()
    monkeypatch.chdir(root)
    again = invoke("build", "demo_out/mlp.pt2", "--quiet")
    assert again.exit_code == 2
    assert "output demo_out/mlp_pkg exists; pass --force" in again.stderr
    assert (root / "demo_out" / "mlp_pkg" / "manifest.json").read_text() == before


def test_device_auto_is_resolved_said_and_recorded(default_build, packages):
    root, result = default_build
    assert result.exit_code == 0, result.stderr
    resolved = "cpu" if NO_GPU else "cuda"
    manifest = json.loads((root / "demo_out" / "mlp_pkg" / "manifest.json").read_text())
    assert manifest["device"]["type"] == resolved and manifest["device"]["requested"] == "auto"
    assert f"device auto -> {resolved}" in result.stderr  # the progress line
    if NO_GPU:
        assert "device auto -> cpu (no CUDA GPU)" in result.stderr
    # conftest builds with --device cpu
    explicit = json.loads((packages.get("mlp").package / "manifest.json").read_text())
    assert explicit["device"]["type"] == "cpu" and explicit["device"]["requested"] == "cpu"


def test_resolve_device(monkeypatch, tmp_path):
    cfg = BuildConfig(artifact=tmp_path / "m.pt2", output=tmp_path / "pkg")
    assert cfg.device == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    resolved, line = resolve_device(cfg)
    assert (resolved.device, resolved.requested_device, line) == (
        "cpu",
        "auto",
        "device auto -> cpu (no CUDA GPU)",
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H100")
    resolved, line = resolve_device(cfg)
    assert (resolved.device, resolved.requested_device, line) == (
        "cuda",
        "auto",
        "device auto -> cuda (NVIDIA H100)",
    )
    resolved, line = resolve_device(
        BuildConfig(artifact=tmp_path / "m.pt2", output=tmp_path / "pkg", device="cpu")
    )
    assert (resolved.device, resolved.requested_device, line) == ("cpu", "cpu", "")


@pytest.mark.skipif(not NO_GPU, reason="auto picks the GPU on this machine")
@pytest.mark.parametrize("how", ["flag", "config"])
def test_tf32_with_auto_on_a_cpu_machine_is_refused(packages, tmp_path, how):
    if how == "flag":
        args = ["--precision", "tf32"]
    else:
        (tmp_path / "build.yaml").write_text("device: auto\nprecision: tf32\n")
        args = ["--config", tmp_path / "build.yaml"]
    result = invoke("build", packages.get("mlp").artifact, "-o", tmp_path / "pkg", *args)
    assert result.exit_code == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert (
        "error: --precision tf32 needs --device cuda (TF32 is a GPU tensor-core format); "
        "--device auto chose cpu: this machine has no CUDA GPU"
    ) in result.stderr
    assert not (tmp_path / "pkg").exists()


def test_unknown_device_in_a_config_file(packages, tmp_path):
    (tmp_path / "build.yaml").write_text("device: gpu\n")
    result = invoke(
        "build",
        packages.get("mlp").artifact,
        "-o",
        tmp_path / "pkg",
        "--config",
        tmp_path / "build.yaml",
    )
    assert result.exit_code == 2 and "--device gpu is not one of auto, cpu, cuda" in result.stderr


def positions_model():
    """tests/models/positions.py's model, built as aotc loads it."""
    from aotc.export.loading import load_model

    return load_model(str(MODELS / "positions.py")).module


def device_arguments(ep) -> dict:
    """{op name: [device arguments]} of the graph, positional (aten.to.device) and keyword."""
    found = {}
    for node in ep.graph.nodes:
        values = [a for a in node.args if isinstance(a, (torch.device, str))] + [
            v for k, v in node.kwargs.items() if k == "device"
        ]
        if node.op == "call_function" and values:
            found.setdefault(str(node.target), []).extend(values)
    return found


def test_cuda_target_names_device_index_0():
    assert target_device("cuda") == torch.device("cuda", 0) and target_device("cuda").index == 0
    assert target_device("cpu") == torch.device("cpu")


def test_placed_graph_names_cuda_0_everywhere():
    """What move_to_device_pass(ep, "cuda") left (device=cuda, no index) becomes cuda:0; no CUDA
    needed, nothing runs."""
    ids = torch.randint(0, 50, (2, 5))
    ep = torch.export.export(positions_model(), (ids,), strict=False)
    name_graph_devices(ep.graph_module, torch.device("cuda"))  # the bug: a bare "cuda" in the graph
    assert torch.device("cuda") in device_arguments(ep)["aten._assert_tensor_metadata.default"]
    changed = name_graph_devices(ep.graph_module, target_device("cuda"))
    found = device_arguments(ep)
    assert {
        "aten.arange.default",
        "aten._assert_tensor_metadata.default",
        "aten.ones.default",
        "aten.to.device",
    } <= set(found)
    assert changed == sum(len(values) for values in found.values())
    assert all(
        isinstance(v, torch.device) and v == torch.device("cuda", 0)
        for values in found.values()
        for v in values
    )


def test_move_program_keeps_the_graph_runnable():
    ids = torch.randint(0, 50, (2, 5))
    model = positions_model()
    ep = move_program(torch.export.export(model, (ids,), strict=False), target_device("cpu"))
    assert all(v == torch.device("cpu") for values in device_arguments(ep).values() for v in values)
    torch.testing.assert_close(ep.module()(ids), model(ids))


def test_missing_matplotlib_fails_before_benchmarking(packages, tmp_path, monkeypatch):
    package = packages.get("mlp").package
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError

    def benchmark(*args, **kwargs):
        raise AssertionError("the benchmark ran before the missing dependency was reported")

    monkeypatch.setattr(aotc.api, "bench", benchmark)
    result = invoke("bench", package, "--plot", tmp_path / "b.png")
    assert result.exit_code == 2
    assert result.stderr.strip() == PLOT_ERROR
    assert not (tmp_path / "b.png").exists()


def test_require_names_the_extra(tmp_path, monkeypatch):
    from aotc.bench.plot import write_plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(
        UserInputError,
        match=r"--plot needs matplotlib, which is not installed; pip install 'aotc\[bench\]'",
    ):
        write_plot({}, tmp_path / "b.png")  # the library path (aotc.api.bench) says the same
    (tmp_path / "broken_dep.py").write_text(
        textwrap.dedent("""\
        import a_module_that_is_not_there
    """)
    )
    monkeypatch.syspath_prepend(tmp_path)
    with pytest.raises(UserInputError, match="installed but fails to import") as error:
        require("broken_dep", "bench", "--plot")
    assert error.value.exit_code == 2 and "a_module_that_is_not_there" in str(error.value)
    assert require("json", "bench", "--plot") is json


@pytest.mark.gpu
def test_embedding_model_with_device_calls_builds_on_cuda(tmp_path):
    """The GPT-2 failure (device=cuda vs tensors on cuda:0) on a small model of the same pattern, through the CLI."""
    import aotc_runtime
    from aotc.export.loading import load_model

    model_file = MODELS / "positions.py"
    artifact = tmp_path / "positions.pt2"
    result = invoke("export", model_file, "-o", artifact)
    assert result.exit_code == 0, result.stderr
    result = invoke("build", artifact, "--device", "cuda", "-o", tmp_path / "pkg", "--quiet")
    assert result.exit_code == 0, result.stderr
    package = aotc_runtime.load(tmp_path / "pkg")
    assert package.manifest.device.type == "cuda" and package.manifest.device.requested == "cuda"
    ids = torch.randint(0, 50, (2, 5), device="cuda")
    eager = load_model(str(model_file), None).module.cuda()
    with torch.no_grad():
        torch.testing.assert_close(package(ids), eager(ids), atol=1e-4, rtol=1e-4)
