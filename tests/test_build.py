"""aotc build: the manifest, the numeric check, atomic writes, crash and interrupt handling, config precedence."""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import invoke

import aotc.compiler.backends.inductor
import aotc.compiler.verify
import aotc.errors
from aotc_runtime import hash_package_files

REQUIRED = [
    "format_version",
    "aotc_version",
    "created",
    "toolchain",
    "device",
    "mode",
    "precision",
    "inductor_options",
    "runtime",
    "signature",
    "files",
    "build_seconds",
    "numeric_check",
    "source",
    "size_bytes",
]


def leftovers(folder):
    return [p.name for p in folder.iterdir() if ".aotc-" in p.name]


def test_manifest_records_the_build(packages):
    built = packages.get("cnn_bn")
    manifest = json.loads((built.package / "manifest.json").read_text())
    for key in REQUIRED:
        assert key in manifest, key
    assert manifest["files"] == hash_package_files(built.package)
    assert manifest["toolchain"]["torch"] == torch.__version__
    assert manifest["toolchain"]["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert (
        "g++" in manifest["toolchain"]["cxx_version"]
        or "gcc" in manifest["toolchain"]["cxx_version"]
    )
    device = manifest["device"]
    assert {k: device[k] for k in ("type", "requested", "cpu_isa")} == {
        "type": "cpu",
        "requested": "cpu",
        "cpu_isa": "native",
    }
    assert isinstance(device["cpu_features"], list)
    # the default mode adds nothing to Inductor's defaults but how the weights are packaged
    from aotc.compiler.inductor_options import PACKAGING_OPTIONS

    assert manifest["mode"] == "default" and manifest["inductor_options"] == PACKAGING_OPTIONS
    check = manifest["numeric_check"]
    assert check["passed"] and check["outputs"][0]["name"] == "output_0"
    assert {"max_abs", "max_rel", "atol", "rtol", "ok"} <= set(check["outputs"][0])
    assert manifest["source"]["artifact"] == str(built.artifact.resolve())


def test_manifest_says_where_the_build_time_went(packages):
    manifest = json.loads((packages.get("cnn_bn").package / "manifest.json").read_text())
    # aotc's own stages (aotc.load, ...) are checked by test_the_build_says_where_its_time_went
    phases = {k: v for k, v in manifest["build_phases"].items() if not k.startswith("aotc.")}
    # A CPU build compiles C++: some Inductor phase takes over the 0.5 s the record starts at.
    assert phases, "no Inductor phase recorded"
    for name, phase in phases.items():
        assert 0.5 <= phase["seconds"] <= manifest["build_seconds"], name
        assert phase["calls"] >= 1
    seconds = [phase["seconds"] for phase in phases.values()]
    assert seconds == sorted(seconds, reverse=True)


@pytest.fixture
def compiled_once(packages, monkeypatch) -> Path:
    """The MLP's artifact, whose builds here take their compiled model from the session's MLP
    package instead of compiling it again (the same artifact, mode and device, and a build gives
    the same bytes from the same inputs: aotc/compiler/reproducible.py). For tests of what a build
    does after the compile (the check, the write); the compile itself is the session package's,
    built and checked for real. `monkeypatch.undo()` brings the real compile back."""
    built = packages.get("mlp")

    def copy_compiled(ep, package_path, options, precision):
        shutil.copyfile(built.package / "model.pt2", package_path)

    monkeypatch.setattr(aotc.compiler.backends.inductor, "compile_aoti", copy_compiled)
    return built.artifact


def test_numeric_mismatch_fails_and_writes_nothing(compiled_once, tmp_path, monkeypatch):
    artifact = compiled_once  # built before the check is sabotaged
    real = aotc.compiler.verify.eager_outputs
    monkeypatch.setattr(
        aotc.compiler.verify,
        "eager_outputs",
        lambda ep, cases, signature: [[t + 0.5 for t in out] for out in real(ep, cases, signature)],
    )
    result = invoke("build", artifact, "-o", tmp_path / "pkg", "--quiet")
    assert result.exit_code == 6, result.stderr
    assert "package output 'output_0' differs from eager by max abs 0.5" in result.stderr
    assert "--allow-mismatch" in result.stderr
    assert not (tmp_path / "pkg").exists() and not leftovers(tmp_path)
    result = invoke("build", artifact, "-o", tmp_path / "pkg", "--quiet", "--allow-mismatch")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert manifest["numeric_check"]["passed"] is False


def test_crash_in_child_becomes_a_build_error(compiled_once, tmp_path, monkeypatch):
    artifact = compiled_once
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    monkeypatch.setattr(aotc.compiler.verify, "check_command", lambda *args: crash)
    result = invoke("build", artifact, "-o", tmp_path / "pkg", "--quiet")
    assert result.exit_code == 5
    assert "crashed when loaded and run in a child process (SIGSEGV)" in result.stderr
    assert not (tmp_path / "pkg").exists() and not leftovers(tmp_path)


def test_interrupted_build_leaves_nothing(packages, tmp_path, monkeypatch):
    artifact = packages.get("sincos").artifact

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(aotc.compiler.backends.inductor, "compile_aoti", interrupt)
    result = invoke("build", artifact, "-o", tmp_path / "pkg", "--quiet")
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert not (tmp_path / "pkg").exists() and not leftovers(tmp_path)


def test_force_replaces_a_package_only_when_the_new_one_is_whole(
    compiled_once, tmp_path, monkeypatch
):
    artifact = compiled_once
    target = tmp_path / "pkg"
    target.mkdir()
    (target / "old.txt").write_text("old")
    monkeypatch.setattr(
        aotc.compiler.verify,
        "check_command",
        lambda *a: [sys.executable, "-c", "raise SystemExit(3)"],
    )
    result = invoke("build", artifact, "-o", target, "--force", "--quiet")
    assert result.exit_code == 5
    assert (target / "old.txt").read_text() == "old"  # the failed build did not touch it
    monkeypatch.undo()  # the real check, and the real compile
    result = invoke("build", artifact, "-o", target, "--force", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert not (target / "old.txt").exists() and (target / "manifest.json").is_file()


def test_config_file_and_flags_precedence(packages, tmp_path):
    config = tmp_path / "build.yaml"
    config.write_text("mode: max-autotune\natol: 0.5\noptions:\n  freezing: true\n")
    result = invoke(
        "build",
        packages.get("sincos").artifact,
        "-o",
        tmp_path / "pkg",
        "--config",
        config,
        "--atol",
        "0.25",
        "--quiet",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert manifest["mode"] == "max-autotune"  # from the file
    assert manifest["numeric_check"]["atol"] == 0.25  # the flag wins over the file
    assert manifest["inductor_options"]["freezing"] is True  # from the file, over the preset
    assert manifest["inductor_options"]["max_autotune"] is True  # preset


def test_compiler_choice_skips_a_gxx_with_newer_headers(tmp_path, monkeypatch):
    """$CXX naming a g++ whose headers are newer than the loaded libstdc++ is passed over (it would crash on load)."""
    from aotc.compiler import toolchain

    library = toolchain.loaded_libstdcxx()
    if library is None or toolchain.compiler_gcc_release("g++") is None:
        pytest.skip("needs Linux and g++")
    fake = tmp_path / "newer-g++"
    fake.write_text(
        '#!/bin/sh\nfor a in "$@"; do [ "$a" = "-dM" ] && echo "#define _GLIBCXX_RELEASE 99" && exit '
        '0; done\nexec g++ "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    # exercise the header check
    monkeypatch.setattr(toolchain, "compiler_beside", lambda library: None)
    path, record = toolchain.choose_compiler()
    assert path != str(fake)
    assert record["cxx_headers_gcc_release"] <= record["libstdcxx_gcc_release"]
    monkeypatch.setenv("AOTC_CXX", str(fake))
    assert toolchain.choose_compiler()[0] == str(fake)


def test_compiler_beside_the_loaded_libstdcxx_comes_first(tmp_path, monkeypatch):
    from aotc.compiler import toolchain

    library = toolchain.loaded_libstdcxx()
    beside = toolchain.compiler_beside(library)
    if beside is None:
        pytest.skip("no g++ installed beside the loaded libstdc++")
    monkeypatch.setenv("CXX", "/bin/false-g++-that-does-not-exist")
    path, record = toolchain.choose_compiler()
    assert path == beside and record["cxx_choice"] == "installed beside the libstdc++ torch loads"


def test_bf16_package_keeps_the_exported_signature(packages, tmp_path):
    result = invoke(
        "build",
        packages.get("cnn_bn").artifact,
        "--precision",
        "bf16",
        "-o",
        tmp_path / "pkg",
        "--quiet",
    )
    assert result.exit_code == 0, result.stderr
    from conftest import eager_model

    import aotc_runtime

    package = aotc_runtime.load(tmp_path / "pkg")
    assert package.manifest.precision == "bf16" and package.manifest.numeric_check.atol == 5e-2
    x = torch.randn(16, 3, 128, 128)
    out = package(x)
    assert out.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(out, eager_model("cnn_bn")(x), atol=5e-2, rtol=5e-2)


def test_strict_fp32_check_turns_tf32_off_on_both_sides_and_restores_it(monkeypatch):
    """The fp32 check on CUDA compares without TF32: in this process, and (by env) in the child."""
    from aotc.math_mode import strict_fp32

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    with strict_fp32():
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cudnn.allow_tf32  # the user's setting comes back

    seen = {}

    def fake_run(command, **kwargs):
        seen["env"] = kwargs["env"]
        raise aotc.compiler.verify.subprocess.TimeoutExpired(command, 1)

    monkeypatch.setattr(aotc.compiler.verify.subprocess, "run", fake_run)
    for strict, flag in ((True, "1"), (False, "0")):
        with pytest.raises(aotc.errors.BuildError):
            aotc.compiler.verify.run_in_child("unused", [("example", [torch.zeros(1)])], strict)
        assert seen["env"][aotc.compiler.verify.STRICT_FP32_ENV] == flag


def test_views_become_reshapes_before_a_move_to_another_device():
    """A CPU-traced `view` may not fit CUDA strides (vit_b_16); `reshape` means the same where it fits."""
    from aotc.export.placement import reshape_instead_of_view

    class Flatten(torch.nn.Module):
        def forward(self, x):
            return (x.permute(1, 0, 2).contiguous().view(-1, 8) * 2).sum(0)

    x = torch.randn(5, 3, 8)
    ep = torch.export.export(Flatten(), (x,), strict=False)
    assert torch.ops.aten.view.default in [n.target for n in ep.graph.nodes]
    reshape_instead_of_view(ep)
    targets = [n.target for n in ep.graph.nodes]
    assert torch.ops.aten.view.default not in targets and torch.ops.aten.reshape.default in targets
    torch.testing.assert_close(ep.module()(x), Flatten()(x))


def test_sigterm_during_build_cleans_up_like_ctrl_c(packages, tmp_path):
    """timeout, Docker and CI stop a build with SIGTERM: nothing of it may be left behind."""
    import signal
    import subprocess
    import time

    artifact = packages.get("mlp").artifact
    output = tmp_path / "pkg"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aotc",
            "build",
            str(artifact),
            "--device",
            "cpu",
            "-o",
            str(output),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    staging = tmp_path / f".pkg.aotc-tmp-{proc.pid}"
    deadline = time.monotonic() + 120
    while not staging.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert staging.exists(), "the build never started writing"
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted; nothing was written" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    assert not list(Path(tempfile.gettempdir()).glob(f"aotc-verify-{proc.pid}-*"))


def test_a_killed_builds_leftovers_are_removed_by_the_next_build(packages, tmp_path):
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()  # a PID no process has now
    stale = tmp_path / f".pkg.aotc-tmp-{dead.pid}"
    (stale / "model.pt2").parent.mkdir()
    (stale / "model.pt2").write_bytes(b"half a model")
    stale_check = Path(tempfile.gettempdir()) / f"aotc-verify-{dead.pid}-x"
    stale_check.mkdir(exist_ok=True)
    result = invoke(
        "build", packages.get("mlp").artifact, "--device", "cpu", "-o", tmp_path / "pkg", "--quiet"
    )
    assert result.exit_code == 0, result.stderr
    assert not stale.exists() and not stale_check.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


def test_two_builds_into_one_folder_at_once_are_refused(packages, tmp_path):
    from aotc.compiler.package_writer import output_lock

    with output_lock(tmp_path / "pkg"):  # what a running build holds
        result = invoke(
            "build", packages.get("mlp").artifact, "--device", "cpu", "-o", tmp_path / "pkg"
        )
    assert result.exit_code == 2 and "another aotc build is writing" in result.stderr
    assert not (tmp_path / "pkg").exists()


def test_a_crafted_artifact_cannot_run_code_at_build(packages, tmp_path):
    """A weight entry marked use_pickle makes torch.export.load unpickle it (code execution):
    aotc refuses the file before torch reads it."""
    import pickle
    import subprocess
    import zipfile

    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('x')",))

    source, crafted = packages.get("mlp").artifact, tmp_path / "crafted.pt2"
    with zipfile.ZipFile(source) as original:
        config_name = next(n for n in original.namelist() if n.endswith("weights_config.json"))
        config = json.loads(original.read(config_name))
        entry = next(iter(config["config"].values()))
        entry["use_pickle"] = True
        weight_name = config_name.rsplit("/", 1)[0] + "/" + entry["path_name"]
        with zipfile.ZipFile(crafted, "w") as out:
            for info in original.infolist():
                data = original.read(info)
                if info.filename == config_name:
                    data = json.dumps(config).encode()
                elif info.filename == weight_name:
                    data = pickle.dumps(Payload())
                out.writestr(info, data)
    # The threat is real: torch.export.load itself runs the payload.
    subprocess.run(
        [sys.executable, "-c", f"import torch; torch.export.load({str(crafted)!r})"],
        capture_output=True,
        timeout=300,
    )
    assert marker.exists(), "the crafted artifact did not reproduce the finding"
    marker.unlink()
    result = invoke("build", crafted, "--device", "cpu", "-o", tmp_path / "pkg")
    assert result.exit_code == 2 and "pickled entries" in result.stderr, result.stderr
    assert not marker.exists() and not (tmp_path / "pkg").exists()


def test_the_build_says_where_its_time_went(packages):
    """aotc's stages beside Inductor's timers in build_phases, summed up in one line."""
    import aotc_runtime
    from aotc.cli.build import time_breakdown

    phases = aotc_runtime.read_manifest(packages.get("mlp").package).build_phases
    assert {"aotc.load", "aotc.lower", "aotc.compile", "aotc.check"} <= set(phases)
    assert set(phases["aotc.cpu_isa_probe"]) == {"seconds", "calls"}
    line = time_breakdown(phases)
    assert line.startswith("load ") and ", compile " in line and ", check " in line
    probe = phases["aotc.cpu_isa_probe"]
    assert ("CPU ISA probe" in line) == bool(probe["calls"]), (line, probe)
    assert (
        phases["aotc.compile"]["seconds"] >= phases.get("compile_file", {"seconds": 0})["seconds"]
    )


def test_a_decoder_lm_builds_in_bf16(tmp_path):
    """Llama's RMSNorm and rotary embedding upcast to float32 and cast back with `.to(input_dtype)`,
    which an fp32 trace records as nothing; cast to bf16, the program fed a float32 activation to a
    bf16 weight ("expected m1 and m2 to have the same dtype") and the check failed. The products and
    attention now run in the weight's dtype, as eager bf16 does."""
    import importlib.util

    import torch

    import aotc_runtime

    source = Path(__file__).parent / "zoo" / "llama.py"
    artifact, package = tmp_path / "llama.pt2", tmp_path / "llama_bf16"
    torch.manual_seed(0)  # the export's get_model() and the eager one below get the same weights
    assert invoke("export", source, "-o", artifact).exit_code == 0
    result = invoke("build", artifact, "--device", "cpu", "--precision", "bf16", "-o", package)
    assert result.exit_code == 0, result.stderr
    spec = importlib.util.spec_from_file_location("zoo_llama", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model, inputs = module.get_model().eval(), module.example_inputs()
    with torch.no_grad():
        reference = model.to(torch.bfloat16)(**inputs).logits.float()
    got = aotc_runtime.load(package)(**inputs)["logits"]
    # against eager in bf16: the same precision, so within bf16 rounding of logits of size ~1
    torch.testing.assert_close(got, reference, atol=5e-2, rtol=5e-2)


def test_a_cuda_generation_build_fuses_sibling_kernels_unless_told_otherwise():
    """A text-generation step on CUDA builds with Inductor's combo kernels (its decode is bound by
    kernel launches); --option and --config still win, and the CPU and one-call models keep the
    preset's options."""
    from aotc.compiler.inductor_options import GENERATION_CUDA_OPTIONS, generation_options

    assert generation_options("cuda", {"max_autotune": True}) == {
        **GENERATION_CUDA_OPTIONS,
        "max_autotune": True,
    }
    assert generation_options("cuda", {"combo_kernels": False})["combo_kernels"] is False
    assert generation_options("cpu", {"max_autotune": True}) == {"max_autotune": True}
