"""Bad input: each case checks the exit code, the one-line message, and that no traceback is shown."""

import os
import sys

import pytest
from conftest import MLP, MODELS, error_lines, invoke


def line_of(file: str, marker: str) -> int:
    """The line of tests/models/FILE that holds `marker` (errors name the user's file:line)."""
    lines = (MODELS / file).read_text().splitlines()
    return next(
        n for n, text in enumerate(lines, start=1) if marker in text and text.startswith(" ")
    )


def assert_error(result, code, *fragments):
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize(
    "shape, fragment",
    [
        ("16x3xx128", "empty dim at position 3"),
        ("16x-3", "sizes must be >= 1"),
        ("0x3", "sizes must be >= 1"),
    ],
)
def test_malformed_shape_flags(tmp_path, shape, fragment):
    result = invoke("export", MLP, "--input-shape", shape, "-o", tmp_path / "m.pt2")
    assert_error(result, 2, "--input-shape", fragment)
    assert not (tmp_path / "m.pt2").exists()


def test_shape_name_without_range(tmp_path):
    result = invoke("export", MLP, "--input-shape", "abc", "-o", tmp_path / "m.pt2")
    assert_error(result, 2, "shape dim 'abc' has no range: pass --dim abc=MIN:MAX")


def test_missing_model_file(tmp_path):
    result = invoke(
        "export", tmp_path / "nope.py", "--input-shape", "2x2", "-o", tmp_path / "m.pt2"
    )
    assert_error(result, 2, "model file", "does not exist")


def test_file_without_model(tmp_path):
    result = invoke(
        "export", MODELS / "no_model.py", "--input-shape", "2x2", "-o", tmp_path / "m.pt2"
    )
    assert_error(result, 3, "defines no model", "--entry NAME", "helper")


def test_ambiguous_entry_lists_candidates(tmp_path):
    result = invoke(
        "export", MODELS / "two_models.py", "--input-shape", "2x2", "-o", tmp_path / "m.pt2"
    )
    assert_error(result, 2, "First, Second", "--entry NAME")


def test_constructor_raises(tmp_path):
    result = invoke(
        "export", MODELS / "ctor_raises.py", "--input-shape", "2x4", "-o", tmp_path / "m.pt2"
    )
    assert_error(
        result,
        3,
        f"ctor_raises.py:{line_of('ctor_raises.py', 'raise ValueError')}",
        'raise ValueError("weights file missing")',
        "weights file missing",
    )


def test_feature_pyramid_as_written_fails_in_the_model_itself(tmp_path):
    result = invoke(
        "export",
        MODELS / "feature_pyramid_broken.py",
        "--input-shape",
        "1x3x224x224",
        "-o",
        tmp_path / "m.pt2",
    )
    assert_error(
        result,
        3,
        "the model itself fails",
        f"feature_pyramid_broken.py:{line_of('feature_pyramid_broken.py', 'return self.decoder(pooled)')}",
        "return self.decoder(pooled)",
        "1x802816 and 64x10",
        "1x3x224x224 float32",
    )
    assert not (tmp_path / "m.pt2").exists()


def test_data_dependent_control_flow(tmp_path):
    result = invoke(
        "export", MODELS / "data_dependent.py", "--input-shape", "4x4", "-o", tmp_path / "m.pt2"
    )
    where = f"data_dependent.py:{line_of('data_dependent.py', 'if x.sum() < 0:')}"
    assert_error(result, 4, where, "if x.sum() < 0:", "torch.cond", "aotc explain")
    assert len(error_lines(result.stderr)) == 1, result.stderr
    assert not (tmp_path / "m.pt2").exists()


def test_artifact_that_is_random_bytes(tmp_path):
    bogus = tmp_path / "bogus.pt2"
    bogus.write_bytes(os.urandom(4096))
    result = invoke("build", bogus, "-o", tmp_path / "pkg")
    assert_error(result, 2, "is not a torch.export artifact", "aotc export")
    assert not (tmp_path / "pkg").exists()


def test_truncated_artifact(packages, tmp_path):
    data = packages.get("mlp").artifact.read_bytes()
    cut = tmp_path / "cut.pt2"
    cut.write_bytes(data[: len(data) // 2])
    result = invoke("build", cut, "-o", tmp_path / "pkg")
    assert_error(result, 2, "is not a torch.export artifact")
    assert not (tmp_path / "pkg").exists()
    assert not [p for p in tmp_path.iterdir() if "aotc-tmp" in p.name]


def test_existing_outputs_are_not_overwritten(packages, tmp_path):
    built = packages.get("mlp")
    taken = tmp_path / "taken.pt2"
    taken.write_text("keep me")
    result = invoke("export", MLP, "--input-shape", "32x128", "-o", taken)
    assert_error(result, 2, "exists; pass --force")
    assert taken.read_text() == "keep me"
    result = invoke("build", built.artifact, "-o", built.package)
    assert_error(result, 2, "exists; pass --force")


def test_unknown_inductor_option(packages, tmp_path):
    result = invoke(
        "build",
        packages.get("mlp").artifact,
        "-o",
        tmp_path / "pkg",
        "--option",
        "max_autotun=true",
    )
    assert_error(result, 2, "unknown Inductor option 'max_autotun'", "did you mean 'max_autotune'")


def test_config_file_with_unknown_key(packages, tmp_path):
    config = tmp_path / "build.yaml"
    config.write_text("mode: default\nprecison: fp32\n")
    result = invoke(
        "build", packages.get("mlp").artifact, "-o", tmp_path / "pkg", "--config", config
    )
    assert_error(result, 2, "unknown key 'precison'", "did you mean 'precision'")


def test_help_documents_exit_codes():
    result = invoke("--help")
    assert result.exit_code == 0
    for line in (
        "Exit codes:",
        "4  torch.export cannot capture",
        "7  package refused",
        "130  interrupted",
    ):
        assert line in result.stdout


def test_verbose_shows_the_traceback_and_keeps_the_exit_code(tmp_path):
    """--verbose exited 1 where the same failure exits with its own code without it."""
    args = ["export", MODELS / "no_model.py", "--input-shape", "2x2", "-o", tmp_path / "m.pt2"]
    quiet, loud = invoke(*args), invoke("--verbose", *args)
    assert quiet.exit_code == loud.exit_code == 3, (quiet.stderr, loud.stderr)
    assert "Traceback (most recent call last)" in loud.stderr
    assert "Traceback" not in quiet.stderr
    assert loud.stderr.strip().splitlines()[-1] == quiet.stderr.strip().splitlines()[-1]
    assert "defines no model" in quiet.stderr


FAILING_CHILD_STDERR = """\
[W1123 12:00:00] some warning
Error: CUDA driver error: an illegal memory access was encountered
Exception raised from run_impl at /pytorch/torch/csrc/inductor/aoti_runtime/model.h:412
frame #0: c10::Error::Error + 0x42
RuntimeError: run_func_( container_handle_, ... ) API call failed at model_container_runner.cpp, line 145
frame #35: _start + 0x25
"""


def test_a_failed_child_names_the_native_cause_not_the_wrapper():
    """The Llama bf16 check failed with only AOTInductor's "API call failed" wrapper; the cause
    it printed above (here a CUDA error) is the line to show."""
    from aotc.child_process import failure_line

    assert failure_line(FAILING_CHILD_STDERR, 1) == (
        "Error: CUDA driver error: an illegal memory access was encountered"
    )
    # the Llama bf16 failure on the H100 (2026-11-23): the cause is a C++ log line, above two
    # wrappers (the generated wrapper's "Error: aoti_torch_cuda_mm_out(...) API call failed")
    llama = (
        "[E1123 18:22:10.655812392 c_shim_cuda.cpp:1273] Exception in aoti_torch: expected mat1 and "
        "mat2 to have the same dtype, but got: float != c10::BFloat16\n"
        "Exception raised from addmm_out_cuda_impl at /pytorch/aten/src/ATen/native/cuda/Blas.cpp:349\n"
        "frame #0: c10::Error::Error(c10::SourceLocation) + 0x9d\n"
        "Error: aoti_torch_cuda_mm_out(buf5, buf4) API call failed at x.wrapper.cpp, line 3514\n"
        "RuntimeError: run_func_( container_handle_ ) API call failed at model_container_runner.cpp\n"
    )
    assert failure_line(llama, 1) == (
        "Exception in aoti_torch: expected mat1 and mat2 to have the same dtype, but got: float != "
        "c10::BFloat16"
    )
    assert failure_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n", 1)
    assert failure_line("", -9) == "exit status -9"
    # a native assertion is a cause; a line that only names torch's _assert_* ops is not
    assert_failed = "x.cpp:12: void f(): Assertion `n > 0' failed.\n"
    noise = "W1123 graph.py:88] skipping torch.ops.aten._assert_tensor_metadata.default\n"
    assert failure_line(assert_failed + noise, -6) == assert_failed.strip()


def test_a_failing_check_child_says_why_and_verbose_prints_all_of_it(
    packages, tmp_path, monkeypatch
):
    """The check's child made to fail on purpose: the error names its cause, --verbose prints the
    child's whole stderr, and the exit code is 5 either way."""
    import aotc.compiler.verify as verify

    artifact = packages.get("mlp").artifact  # built (with its real check) before the patch
    script = tmp_path / "failing_child.py"
    script.write_text(
        "import sys\n"
        "sys.stderr.write('noise before\\nError: the cause the user needs\\n')\n"
        "sys.stderr.write('RuntimeError: run_func_( container_handle_ ) API call failed at x.cpp\\n')\n"
        "sys.exit(1)\n"
    )
    monkeypatch.setattr(verify, "check_command", lambda *paths: [sys.executable, str(script)])
    args = ["build", artifact, "--device", "cpu", "-o"]
    quiet = invoke(*args, tmp_path / "a")
    loud = invoke("--verbose", *args, tmp_path / "b")
    assert quiet.exit_code == loud.exit_code == 5
    (line,) = [x for x in quiet.stderr.splitlines() if x.startswith("error:")]
    assert line.endswith("failed its check run in a child process: Error: the cause the user needs")
    assert "noise before" in loud.stderr and "noise before" not in quiet.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_meaning_errors_are_gathered(packages, tmp_path):
    result = invoke(
        "build",
        packages.get("mlp").artifact,
        "-o",
        tmp_path / "pkg",
        "--device",
        "cpu",
        "--precision",
        "tf32",
        "--atol",
        "-1",
    )
    assert_error(result, 2, "--precision tf32 needs --device cuda", "--atol must be >= 0")
    assert not (tmp_path / "pkg").exists()


def test_cuda_build_without_gpu(packages, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = invoke(
        "build", packages.get("mlp").artifact, "-o", tmp_path / "pkg", "--device", "cuda"
    )
    assert_error(result, 2, "--device cuda but this machine has no usable CUDA GPU")


def test_a_full_disk_is_a_one_line_error_and_leaves_nothing(packages, tmp_path, monkeypatch):
    """ENOSPC while writing outputs: exit 2 naming the place, no traceback, no partial file."""
    import errno

    import aotc_runtime.npz

    out = tmp_path / "out"
    out.mkdir()

    def full_disk(target, arrays):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "y.npz"))

    monkeypatch.setattr(aotc_runtime.npz, "write_npz", full_disk)
    result = invoke("run", packages.get("mlp").package, "--output", out / "y.npz")
    assert result.exit_code == 2, result.stderr
    assert (
        result.stderr.startswith("error: no space left on the device holding")
        and "Traceback" not in result.stderr
    )
    assert list(out.iterdir()) == []


FOREIGN_OP_MODEL = """
import torch


@torch.library.custom_op("aotc_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class Model(torch.nn.Module):
    def forward(self, x):
        return twice(x) + 1


def get_model():
    return Model()
"""


def test_an_op_defined_outside_pytorch_is_refused_at_export(tmp_path):
    """An op the model's own code (or a library: transformers' MoE experts) defines in Python
    exports, but no build or runtime process has it: Qwen2-MoE's build failed with a message
    about "Python types". Export now names the op in one line."""
    model = tmp_path / "foreign.py"
    model.write_text(FOREIGN_OP_MODEL)
    artifact = tmp_path / "m.pt2"
    result = invoke("export", model, "--input-shape", "2x3", "-o", artifact)
    assert_error(result, 4, "torch.ops.aotc_test.twice", "defined outside PyTorch")
    assert not artifact.exists()
