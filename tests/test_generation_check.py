"""The build's check of a text-generation package (aotc/compiler/generation_check.py): next-token
logits within a bound scaled to the precision and to each row's spread, and greedy tokens equal
except near ties. A long-prefill fp32 build passes, a model whose weights are stored in bf16
passes at bf16's bound, and a build with a corrupted weight fails with exit 6 naming the step, the
row and the position. Three builds in all: each costs a CPU compile, so the precisions' bounds are
read from the rule's unit tests at the end rather than from one build each."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ZOO, BuildAhead, invoke

from aotc.compiler.generation_check import compare_step
from aotc.compiler.tolerances import GENERATION, computed_precision, tolerance
from aotc_runtime.decode_step import pack

LONG = 2048  # a prefill this long made the element-wise fp32 rule fail on 2.0e-4 against 1e-4
SHORT = 32

# The zoo's Llama with room for LONG positions, its weights scaled up as tests/conftest.py's
# GENERATION_MODEL_FILE does (at the default init scale a random LM repeats one token).
LONG_MODEL = f"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def get_model():
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings={LONG}, use_cache=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model
"""

# The zoo's Llama loaded in bf16, as a model saved in bf16 loads (torch_dtype=torch.bfloat16)
BF16_MODEL = """
import importlib.util
import torch

spec = importlib.util.spec_from_file_location("zoo_lm", {zoo_file!r})
zoo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zoo)


def get_model():
    model = zoo.get_model().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model.to(torch.bfloat16)
"""


def _export(source: Path, artifact: Path, max_len: int) -> list:
    return ["export", source, "--task", "text-generation", "--max-seq-len", max_len,
            "--batch-size", 2, "-o", artifact]  # fmt: skip


def _build(artifact: Path, package: Path, precision: str) -> list:
    return [
        "build",
        artifact,
        "--device",
        "cpu",
        "--precision",
        precision,
        "-o",
        package,
        "--quiet",
    ]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Both models exported and built in child processes from the module's start (BuildAhead):
    the long one at fp32, the bf16 one at bf16."""
    root = tmp_path_factory.mktemp("generation_check")
    (root / "long_lm.py").write_text(LONG_MODEL)
    (root / "bf16_lm.py").write_text(BF16_MODEL.format(zoo_file=str(ZOO / "llama.py")))
    ahead = BuildAhead()
    long, bf16 = root / "long.pt2", root / "bf16.pt2"
    ahead.submit("long", root / "long_fp32", [long], _export(root / "long_lm.py", long, LONG),
                 _build(long, root / "long_fp32", "fp32"))  # fmt: skip
    ahead.submit("bf16_weights", root / "bf16_bf16", [bf16], _export(root / "bf16_lm.py", bf16, SHORT),
                 _build(bf16, root / "bf16_bf16", "bf16"))  # fmt: skip
    yield SimpleNamespace(root=root, ahead=ahead, bf16_artifact=bf16)
    ahead.close()


def _check(builds, key: str, package: str) -> dict:
    """The numeric_check record of a package the build ahead made (its build passed the check)."""
    folder = builds.root / package
    builds.ahead.wait(key, folder)
    return json.loads((folder / "manifest.json").read_text())["numeric_check"]


def test_long_context_at_fp32_passes(builds):
    """The cache's far end at fp32: its last position's attention sums over all LONG positions
    (batch 2 x LONG is past CHECK_TOKENS_PER_CALL, so the check reaches it by windows)."""
    check = _check(builds, "long", "long_fp32")
    last = f"decode of the cache's last position ({LONG - 1}), reading all {LONG}"
    assert check["passed"] and last in check["cases"]
    assert (check["atol"], check["rtol"]) == GENERATION["fp32"]
    logits = check["outputs"][0]
    assert 0 < logits["max_rel"] <= GENERATION["fp32"][1]  # measured: a fraction of the spread
    # a CPU package replays no CUDA graph: each case is called once (a second call repeats it)
    assert logits["worst_case"].endswith(", first call"), logits["worst_case"]


@pytest.mark.parametrize("cuda_graphs, calls", [(True, 2), (False, 1)])
def test_a_package_that_replays_cuda_graphs_is_called_twice_per_case(tmp_path, cuda_graphs, calls):
    from aotc.compiler.generation_check import calls_per_case

    manifest = {"runtime": {"cuda_graphs": cuda_graphs, "tf32": False}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert calls_per_case(tmp_path) == calls


def test_model_stored_in_bf16_passes_at_bf16s_bound(builds):
    """A model in bf16 computes in bf16 at any --precision and is held to bf16's bound (the
    --precision fp32 case of the same rule: test_computed_precision_and_defaults)."""
    check = _check(builds, "bf16_weights", "bf16_bf16")
    assert check["passed"] and (check["atol"], check["rtol"]) == GENERATION["bf16"]
    assert "greedy decode step 8 after the example prompt" in check["cases"]
    assert "greedy tokens equal except near ties" in check["reference"]


def test_corrupted_weight_fails(builds, tmp_path, monkeypatch):
    """A build whose package holds one weight scaled by 1.5 (its reference keeps the model's) is
    refused: exit 6, one line naming what disagreed, where, and the fix; nothing is written."""
    import aotc.compiler.backends.inductor as inductor

    _check(builds, "bf16_weights", "bf16_bf16")  # the artifact exists (and builds healthy)
    place = inductor.place_program

    def corrupted(*args, **kwargs):
        placed = place(*args, **kwargs)
        names = [name for name in placed.state_dict if "layers.1.mlp.down_proj" in name]
        assert names, list(placed.state_dict)
        with torch.no_grad():
            placed.state_dict[names[0]].mul_(1.5)
        return placed

    monkeypatch.setattr(inductor, "place_program", corrupted)
    package = tmp_path / "broken_pkg"
    result = invoke(*_build(builds.bf16_artifact, package, "bf16"))
    assert result.exit_code == 6, result.stderr
    message = result.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert "differ" in message or "greedy token" in message, message
    assert ", row " in message and "predicting position" in message, message
    assert "export the model in fp32" in message and "--allow-mismatch" in message, message
    assert not package.exists()


# The rule itself, on logits whose answer is known


def _step(batch: int = 1):
    """A decode step of each row's token at position 5 (its logits predict position 6)."""
    return pack([(row, 5, [0]) for row in range(batch)])


def test_near_tie_may_flip_and_a_clear_lead_may_not():
    want = torch.tensor([[4.0, 3.99, 0.0, -4.0]])  # spread (std) 3.73
    tie = torch.tensor([[3.995, 3.996, 0.0, -4.0]])  # argmax flips inside the bound
    _abs, _rel, problems = compare_step("tie", _step(), tie, want, 1e-2, 0.5)
    assert problems == []
    flipped = torch.tensor([[4.0, 3.99, 4.5, -4.0]])  # token 2 where eager's 0 leads by 4
    _abs, rel, problems = compare_step("decode step 3", _step(), flipped, want, 1e-2, 0.5)
    assert len(problems) == 1 and problems[0].position == 6 and problems[0].row == 0
    assert "greedy token 2 where eager's is 0, whose logit leads by 4" in problems[0].what
    assert rel == pytest.approx(4.5 / float(want.double().std()))


def test_bound_scales_with_the_spread():
    want = torch.linspace(-30.0, 30.0, 512)[None]  # a wide spread: 17.4
    got = want + 1.0  # a shift of 1: 0.057 of the spread, within bf16's 0.5, far above fp32's
    assert compare_step("s", _step(), got, want, *GENERATION["bf16"])[2] == []
    problems = compare_step("s", _step(), got, want, *GENERATION["fp32"])[2]
    assert "logits differ from eager by 1" in problems[0].what


def test_nan_logits_fail():
    want = torch.tensor([[1.0, 2.0, 3.0]])
    got = torch.tensor([[1.0, float("nan"), 3.0]])
    assert compare_step("s", _step(), got, want, *GENERATION["bf16"])[2]


def test_computed_precision_and_defaults():
    half = {"outputs": [{"name": "logits", "dtype": "bfloat16"}]}
    full = {"outputs": [{"name": "logits", "dtype": "float32"}]}
    assert computed_precision("fp32", half) == "bf16" and computed_precision("fp32", full) == "fp32"
    assert computed_precision("fp16", full) == "fp16"
    task = {"name": "text-generation"}
    assert tolerance("fp32", "cpu", None, None, None, task, half) == GENERATION["bf16"]
    assert tolerance("bf16", "cpu", None, 0.3, None, task, full) == (GENERATION["bf16"][0], 0.3)
    assert tolerance("fp32", "cpu", None, None) == (1e-4, 1e-4)  # one-call models: as before
    # the CPU's int4 kernel multiplies bf16 activations: bf16's bound, on the CPU only
    int4 = "int4-weight-only"
    assert tolerance("fp32", "cpu", None, None, int4, task, full) == GENERATION["bf16"]
    assert tolerance("fp32", "cpu", None, None, int4) == (5e-2, 5e-2)
    assert tolerance("fp32", "cuda", None, None, int4, task, full) == (1e-4, 1e-2)


def test_the_long_context_cases_catch_a_cache_position_one_off(generation_packages, monkeypatch):
    """Past CHECK_TOKENS_PER_CALL the check reaches the cache's end by two chunks and a decode of
    its last position instead of a whole prefill. A step that writes the far chunk one position
    late (a package's indexing error at a long context, played here by the eager program fed
    shifted positions) gives last-position logits the check refuses; the right positions give the
    reference's own logits."""
    from aotc.export import text_generation
    from aotc.export.artifact import load_artifact
    from aotc.export.eager_reference import EagerRun

    # batch 2: windows of 8 positions in the 32-position cache of the session's Llama
    monkeypatch.setattr(text_generation, "CHECK_TOKENS_PER_CALL", 16)
    ep, meta = load_artifact(generation_packages.artifact("llama"))
    cases = text_generation.check_cases(meta.task, "cpu")
    assert [label for label, _ in cases[:3]] == [
        "prefill of 8 tokens at the cache's start",
        "prefill of 8 tokens at positions 23-30",
        "decode of the cache's last position (31), reading all 32",
    ]
    reference, right, wrong = (EagerRun(ep, meta.signature, "cpu") for _ in range(3))
    atol, rtol = GENERATION["fp32"]
    for index, (label, inputs) in enumerate(cases[:3]):
        want = reference.call(label, inputs)[0]
        same = right.call(label, inputs)[0]
        late = [inputs[0], inputs[1], inputs[2] + int(index == 1), inputs[3]]
        got = wrong.call(label, late)[0]
    assert compare_step(label, inputs, same, want, atol, rtol)[2] == []
    problems = compare_step(label, inputs, got, want, atol, rtol)[2]
    assert problems and problems[0].position == 32, problems
