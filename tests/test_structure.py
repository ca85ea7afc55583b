"""Structured inputs and outputs, state, and dims on example_inputs(): what aotc export records and
what the runtime gives back, compared with the eager model."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from dataclasses import dataclass

import numpy
import pytest
import torch
from conftest import MODELS, invoke

import aotc_runtime
from aotc.errors import ModelError
from aotc.export.call_structure import DICT, LIST, TENSOR, TUPLE, flat_leaves, output_layout

Pair = collections.namedtuple("Pair", "first second")


@dataclass
class Plain:
    a: torch.Tensor
    b: object = None


def test_output_layout_names_leaves_by_their_path():
    t = torch.zeros(1)
    assert output_layout(t).structure == TENSOR and output_layout(t).names == ("output_0",)
    assert (
        output_layout((t, None, t)).names == ("output_0", "output_2")
        and output_layout((t, t)).structure == TUPLE
    )
    assert output_layout((t, None, t)).dropped == ("output_1",)
    assert output_layout([t, t]).structure == LIST
    layout = output_layout({"logits": t, "past": ((t, t), None)})
    assert (
        layout.structure == DICT
        and layout.names == ("logits", "past.0.0", "past.0.1")
        and layout.dropped == ("past.1",)
    )
    assert (
        output_layout(Pair(t, t)).names == ("first", "second")
        and output_layout(Pair(t, t)).structure == DICT
    )
    assert output_layout(Plain(t)).names == ("a",) and output_layout(Plain(t)).dropped == ("b",)
    assert output_layout((t, {"x": t})).names == ("output_0", "output_1.x")
    assert len(flat_leaves({"logits": t, "past": ((t, t), None)})) == 3


def test_output_layout_refuses_non_tensor_leaves_by_name():
    with pytest.raises(ModelError, match=r"model output output_1 is a int .*not a tensor"):
        output_layout((torch.zeros(1), 3))


@pytest.fixture(scope="module")
def structured(tmp_path_factory):
    """The structured-output model exported (with a dynamic batch on its example) and built once."""
    root = tmp_path_factory.mktemp("structured")
    artifact = root / "tagger.pt2"
    result = invoke(
        "export", MODELS / "structured_outputs.py", "--dim", "B=1:8@ids:0,mask:0", "-o", artifact
    )
    assert result.exit_code == 0, result.stderr
    assert "note: output aux is None on the example inputs" in result.stderr
    result = invoke("build", artifact, "--device", "cpu", "--quiet", "-o", root / "pkg")
    assert result.exit_code == 0, result.stderr
    return artifact, root / "pkg"


def _eager():
    from aotc.export.loading import load_model

    loaded = load_model(str(MODELS / "structured_outputs.py"))
    return loaded.module, loaded.example_inputs()


@pytest.mark.slow
def test_structured_outputs_signature_and_named_results(structured):

    artifact, package_dir = structured
    package = aotc_runtime.load(package_dir)
    sig = json.loads((package_dir / "manifest.json").read_text())["signature"]
    assert [(i["name"], i["keyword"]) for i in sig["inputs"]] == [("ids", True), ("mask", True)]
    assert sig["inputs"][0]["value_range"] == [0, 49]  # ids index an Embedding(50, 8)
    assert [o["name"] for o in sig["outputs"]] == ["logits", "hidden.0", "hidden.1"]
    assert (
        sig["output_structure"] == "dict"
        and sig["dropped_outputs"] == ["aux"]
        and sig["constants"] == {"scale": 2.0}
    )
    assert sig["dims"]["B"] == {"min": 1, "max": 8, "example": 4}
    module, inputs = _eager()
    for batch in (4, 1, 8):
        ids = torch.randint(0, 50, (batch, 6), generator=torch.Generator().manual_seed(batch))
        mask = torch.ones(batch, 6)
        with torch.no_grad():
            want = module(ids=ids, mask=mask, scale=2.0)
        got = package(ids=ids, mask=mask)
        assert list(got) == ["logits", "hidden.0", "hidden.1"]
        torch.testing.assert_close(got["logits"], want.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["hidden.1"], want.hidden[1], atol=1e-5, rtol=1e-5)
    positional = package(ids, mask)  # positional order is the signature's
    torch.testing.assert_close(positional["logits"], got["logits"])


@pytest.mark.slow
def test_structured_package_and_artifact_load_in_a_fresh_process(structured):
    """The user's Result class is never imported where the artifact or package is loaded."""
    artifact, package_dir = structured
    script = (
        "import torch, aotc_runtime\n"
        f"ep = torch.export.load({str(artifact)!r})\n"
        f"pkg = aotc_runtime.load({str(package_dir)!r})\n"
        "out = pkg(ids=torch.zeros(2, 6, dtype=torch.int64), mask=torch.ones(2, 6))\n"
        "print(sorted(out), type(ep.module()(torch.zeros(2, 6, dtype=torch.int64), torch.ones(2, 6))).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["['hidden.0',", "'hidden.1',", "'logits']", "tuple"]


@pytest.mark.slow
def test_run_reads_named_npz_and_writes_named_outputs(structured, tmp_path):
    _artifact, package_dir = structured
    ids = numpy.arange(12, dtype=numpy.int64).reshape(2, 6)
    # not in signature order
    numpy.savez(tmp_path / "in.npz", mask=numpy.ones((2, 6), numpy.float32), ids=ids)
    result = invoke(
        "run", package_dir, "--input", tmp_path / "in.npz", "--output", tmp_path / "out.npz"
    )
    assert result.exit_code == 0, result.stderr
    out = numpy.load(tmp_path / "out.npz")
    assert out.files == ["logits", "hidden.0", "hidden.1"]
    module, _ = _eager()
    with torch.no_grad():
        want = module(ids=torch.from_numpy(ids), mask=torch.ones(2, 6), scale=2.0)
    torch.testing.assert_close(torch.from_numpy(out["logits"]), want.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_inputs_by_name_errors(structured):
    from aotc_runtime import InputMismatchError

    package = aotc_runtime.load(structured[1])
    ids, mask = torch.zeros(2, 6, dtype=torch.int64), torch.ones(2, 6)
    with pytest.raises(InputMismatchError, match="'ids' is given both by position and by name"):
        package(ids, ids=ids, mask=mask)
    with pytest.raises(InputMismatchError, match="no input named 'idz'; its inputs are ids, mask"):
        package(idz=ids, mask=mask)
    with pytest.raises(InputMismatchError, match="'mask' missing"):
        package(ids=ids)


@pytest.mark.slow
def test_stateful_model_counts_across_calls_like_eager(tmp_path):

    artifact = tmp_path / "counter.pt2"
    result = invoke("export", MODELS / "counter.py", "--input-shape", "2x3", "-o", artifact)
    assert result.exit_code == 0, result.stderr
    assert "state  count: float32 [1]" in result.stdout
    # numeric check call by call
    result = invoke("build", artifact, "--device", "cpu", "--quiet", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["numeric_check"]["passed"]
    package = aotc_runtime.load(tmp_path / "counter_pkg")
    x = torch.ones(2, 3)
    # the state at export, then kept
    assert [package(x)[0, 0].item() for _ in range(3)] == [
        1.0,
        2.0,
        3.0,
    ]
    package.reset_state()
    assert package(x)[0, 0].item() == 1.0
    # a fresh load starts fresh
    assert aotc_runtime.load(tmp_path / "counter_pkg")(x)[0, 0].item() == 1.0
    # A state file that is not a list of tensors (its hash made to match) is refused, not executed or half-used.
    from aotc_runtime import sha256_file

    state_file = tmp_path / "counter_pkg" / "state.pt"
    state_file.write_bytes(b"not a torch file")
    manifest = json.loads((tmp_path / "counter_pkg" / "manifest.json").read_text())
    manifest["files"]["state.pt"] = sha256_file(state_file)
    (tmp_path / "counter_pkg" / "manifest.json").write_text(
        aotc_runtime.hashed_manifest_text(manifest)
    )
    result = invoke("run", tmp_path / "counter_pkg")
    assert (
        result.exit_code == 7
        and "its state.pt could not be read" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_non_tensor_output_refused_at_export(tmp_path):
    result = invoke(
        "export", MODELS / "int_output.py", "--input-shape", "2x3", "-o", tmp_path / "m.pt2"
    )
    assert result.exit_code == 3
    assert (
        "model output output_1 is a int ('3'), not a tensor" in result.stderr
        and "Traceback" not in result.stderr
    )
    assert not (tmp_path / "m.pt2").exists()


def test_named_input_shapes_are_keyword_inputs(tmp_path):
    artifact = tmp_path / "t.pt2"
    result = invoke(
        "export",
        MODELS / "structured_outputs.py",
        "--input-shape",
        "mask=3x6",
        "--input-shape",
        "ids=3x6",
        "--dtype",
        "float32",
        "--dtype",
        "int64",
        "--json",
        "-o",
        artifact,
    )
    assert result.exit_code == 0, result.stderr
    sig = json.loads(result.stdout)["signature"]
    assert [(i["name"], i["dtype"], i["keyword"]) for i in sig["inputs"]] == [
        ("mask", "float32", True),
        ("ids", "int64", True),
    ]
    assert sig["inputs"][1]["value_range"] == [0, 49]


@pytest.mark.parametrize(
    "dim, message",
    [
        ("B=1:8", "with example_inputs() say which axes it names, e.g. --dim B=1:8@ids:0"),
        ("B=1:8@idz:0", "--dim B: no input 'idz' (inputs: ids, mask)"),
        ("B=1:8@ids:5", "input ids has 2 dims, no axis 5"),
        ("B=1:3@ids:0", "example_inputs() has size 4, outside the range"),
        ("B=1:8@ids:0,ids:1", "names axes of different sizes [4, 6]"),
    ],
)
def test_dims_on_example_inputs_errors(tmp_path, dim, message):
    result = invoke(
        "export", MODELS / "structured_outputs.py", "--dim", dim, "-o", tmp_path / "t.pt2"
    )
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr


def test_plain_export_artifact_with_a_user_class_is_explained(tmp_path):
    """An artifact torch.export wrote for a model returning its own class (not through aotc) cannot be
    loaded where that class is not registered: the message says so and how to fix it."""
    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); import structured_outputs as m\n"
        "ep = torch.export.export(m.Tagger(), (), m.example_inputs())\n"
        "torch.export.save(ep, sys.argv[2])\n"
    )
    artifact = tmp_path / "plain.pt2"
    done = subprocess.run(
        [sys.executable, "-c", script, str(MODELS), str(artifact)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # A fresh process: this one has registered Result while loading the model for other tests.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aotc",
            "build",
            str(artifact),
            "--device",
            "cpu",
            "-o",
            str(tmp_path / "pkg"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        "is an export artifact whose inputs or outputs use Python types this process has not imported"
        in result.stderr
    )
    assert not (tmp_path / "pkg").exists()


def test_dim_min_the_model_cannot_run_names_the_smallest_that_works(tmp_path):
    result = invoke(
        "export", MODELS / "short_fails.py", "--dim", "S=2:32@x:1", "-o", tmp_path / "s.pt2"
    )
    assert result.exit_code == 2, result.stderr
    assert "the model fails with S=2, the min of --dim S (IndexError" in result.stderr
    assert (
        "it runs down to S=3: --dim S=3:32@x:1" in result.stderr
        and not (tmp_path / "s.pt2").exists()
    )
