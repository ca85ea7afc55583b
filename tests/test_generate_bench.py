"""`aotc bench` on a text-generation package: the package against transformers' `generate` on the
model it was exported from (aotc/bench/generation.py, generation_bench.py). A handful of tokens,
two rounds, on the CPU; no timing is asserted beyond its shape."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import invoke
from test_bench import assert_one_line_error

import aotc_runtime

pytestmark = pytest.mark.slow
ZOO = Path(__file__).parent / "zoo"
QUICK = ("--prompt-tokens", 6, "--new-tokens", 5, "--rounds", 2, "--warmup", 1)


def test_bench_a_generation_package_against_eager(generation_packages, tmp_path):
    package, _model = generation_packages["gpt2"]
    out = tmp_path / "bench.json"
    result = invoke("bench", package, "--against", "eager", *QUICK, "--json", out)
    assert result.exit_code == 0, result.stderr
    report = json.loads(out.read_text())

    assert report["task"] == "text-generation" and report["contenders"] == ["package", "eager"]
    assert report["package"]["path"] == str(package) and report["artifact"]
    assert {"cpu", "cpu_count", "torch", "python", "aotc", "torch_threads"} <= set(
        report["machine"]
    )
    settings = report["settings"]
    assert (settings["prompt_tokens"], settings["new_tokens"], settings["rounds"]) == (6, 5, 2)
    rows = {row["contender"]: row for row in report["results"]}
    assert set(rows) == {"package", "eager"}
    assert rows["eager"]["tokens_equal"] is True  # the package's greedy tokens are transformers'
    for row in rows.values():
        assert row["first_token_ms"] > 0 and row["decode_tokens_per_s"] > 0
        assert 0 < row["inter_token_ms"]["p50"] <= row["inter_token_ms"]["p99"]
        assert row["decode_speedup_vs_eager"] > 0
    assert rows["eager"]["decode_speedup_vs_eager"] == 1.0

    for text in ("first token ms", "decode tokens/s", "p99 ms/token", "tokens equal", "yes"):
        assert text in result.stdout, result.stdout
    assert f"wrote json {out}" in result.stdout


def test_a_static_compile_that_fails_costs_only_its_row(generation_packages, monkeypatch):
    import aotc.bench.generation as generation
    from aotc.api import BenchConfig, bench
    from aotc.bench.report import format_table

    real = generation.transformers_model

    def failing_compile(source, device, dtype, compiled=False, weights=None):
        model = real(source, device, dtype, weights=weights)
        if compiled:

            def broken(*args, **kwargs):
                raise RuntimeError(
                    "accessing tensor output of CUDAGraphs that has been overwritten"
                )

            model.forward = broken
        return model

    monkeypatch.setattr(generation, "transformers_model", failing_compile)
    package, _model = generation_packages["gpt2"]
    report = bench(BenchConfig(package=package, prompt_tokens=6, new_tokens=5, rounds=2))
    rows = {row["contender"]: row for row in report["results"]}
    assert "CUDAGraphs that has been overwritten" in rows["static-compile"]["error"]
    assert rows["eager"]["tokens_equal"] is True and rows["package"]["decode_tokens_per_s"] > 0
    table = format_table(report)
    assert "static-compile: RuntimeError: accessing tensor output" in table


def test_the_baselines_take_the_weights_the_package_was_exported_with(
    generation_packages, tmp_path
):
    """An export with --weights traced weights the model file alone does not make: the baselines
    must run those, or "tokens equal" compares two different models (it used to)."""
    import torch

    _package, model = generation_packages["gpt2"]  # the zoo GPT-2 with its weights scaled x4
    weights = tmp_path / "trained.pt"
    torch.save(model.state_dict(), weights)
    artifact, package = tmp_path / "lm.pt2", tmp_path / "lm_pkg"
    done = invoke(
        "export", ZOO / "gpt2.py", "--task", "text-generation", "--max-seq-len", 32,
        "--weights", weights, "-o", artifact,
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    done = invoke("build", artifact, "--device", "cpu", "-o", package, "--quiet")
    assert done.exit_code == 0, done.stderr
    # no --batch-size: the default's 8 rows (a cache far below 1 GiB)
    assert aotc_runtime.read_manifest(package).generation.batch_size == 8
    out = tmp_path / "bench.json"
    done = invoke("bench", package, "--against", "eager", *QUICK, "--json", out)
    assert done.exit_code == 0, done.stderr
    rows = {row["contender"]: row for row in json.loads(out.read_text())["results"]}
    assert rows["eager"]["tokens_equal"] is True


def model_file_gone(monkeypatch, tmp_path):
    import aotc.export.artifact as artifact

    real = artifact.read_artifact_meta
    gone = tmp_path / "lm.py"
    monkeypatch.setattr(
        artifact,
        "read_artifact_meta",
        lambda path: dataclasses.replace(real(path), model=f"{gone}:get_model()"),
    )
    return []


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("model file gone", ["lm.py, the model file", "is gone", "--against none"]),
        ("artifact gone", ["--artifact", "does not exist"]),
        ("one-call flags", ["--iters, --batch-sizes", "not for a text-generation package"]),
        ("too many tokens", ["--prompt-tokens 30 and --new-tokens 5", "--max-seq-len"]),
    ],
)
def test_bad_generation_bench_requests_are_one_line(
    generation_packages, monkeypatch, tmp_path, case, fragments
):
    package, _model = generation_packages["gpt2"]
    flags = {
        "model file gone": lambda: model_file_gone(monkeypatch, tmp_path),
        "artifact gone": lambda: ["--artifact", tmp_path / "moved.pt2"],
        "one-call flags": lambda: ["--iters", 5, "--batch-sizes", "1"],
        "too many tokens": lambda: ["--prompt-tokens", 30, "--new-tokens", 5],
    }[case]()
    result = invoke("bench", package, "--against", "eager", *flags)
    assert_one_line_error(result, 2, *fragments)


def test_a_one_call_package_refuses_generation_flags(packages):
    result = invoke("bench", packages.get("mlp").package, "--new-tokens", 8, "--no-cold-start")
    assert_one_line_error(result, 2, "--new-tokens", "one-call package")


def test_bench_and_generate_give_the_same_percentiles_for_the_same_tokens():
    """`aotc bench` of a generation package and `aotc generate` summarize inter-token gaps one
    way (they printed different p99s for the same data: linear against nearest-rank)."""
    from types import SimpleNamespace

    from aotc.bench.generation import summarize
    from aotc.cli.generate import timings

    gaps = [1.0 + (i % 7) * 0.25 + (40.0 if i in (3, 50) else 0.0) for i in range(60)]  # ms
    stamps = [2.0]
    for gap in gaps:
        stamps.append(stamps[-1] + gap / 1e3)
    bench = summarize([SimpleNamespace(began=1.9, stamps=stamps)], new=len(stamps))
    cli = timings(1.9, stamps)
    assert bench["inter_token_ms"]["p99"] == round(cli["decode_p99_ms"], 3)
    assert bench["inter_token_ms"]["p50"] == round(cli["decode_p50_ms"], 3)
    # nearest rank: the 60th of 60 sorted gaps (linear interpolation gave 41.455)
    assert bench["inter_token_ms"]["p99"] == 41.75


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen2", "mistral"])
def test_the_gpt_fast_style_decoder_gives_transformers_tokens(generation_packages, family):
    """The contender is the same model: greedy tokens equal transformers' `generate` (eager here;
    the bench compiles its decode step)."""
    import torch
    from conftest import load_model_file

    from aotc.bench.gpt_fast import GptFastDecoder

    model = load_model_file(generation_packages.model_file(family))
    ids = torch.randint(3, 500, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                  min_new_tokens=12, do_sample=False, pad_token_id=0)  # fmt: skip
    got = GptFastDecoder(model, max_len=24, compiled=False).generate(ids, 12)
    assert got.tolist() == expected.tolist()
    assert len(set(got[0, 7:].tolist())) > 4, "a degenerate sequence tests little"


def test_the_gpt_fast_contender_of_an_int4_package_multiplies_its_int4_weights(generation_packages):
    """For an int4-weight-only package the contender is gpt-fast's int4 mode (tinygemm's layout,
    the CPU twin here) at the package's group size: its logits are the float decoder's on the same
    weights int4-rounded (int4_groups, as the package stores them), up to bf16 activations."""
    import copy
    from types import SimpleNamespace

    import torch
    from conftest import load_model_file

    from aotc.bench.generation import gpt_fast_int4_group
    from aotc.bench.gpt_fast import FastLM
    from aotc.export import quantized_linear as ql
    from aotc.quantize_schemes import DEFAULT_GROUP_SIZE, Quantization

    group = 32
    model = load_model_file(generation_packages.model_file("llama"))
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for module in rounded.modules():
            if isinstance(module, torch.nn.Linear):
                stored = ql.int4_groups(module.weight, group, torch.bfloat16)
                module.weight.copy_(ql.int4_groups_dequantized(*stored, group))
    ids = torch.randint(3, 500, (1, 7), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(7)
    with torch.no_grad():
        int4 = FastLM(model, batch=1, max_len=16, int4_group=group).logits(ids, pos)
        expected = FastLM(rounded, batch=1, max_len=16).logits(ids, pos)
    scale = expected.abs().max().item()
    assert (int4 - expected).abs().max().item() < 0.03 * scale
    # which packages get it
    manifest = lambda record: SimpleNamespace(quantization=record)  # noqa: E731
    assert gpt_fast_int4_group(manifest({"scheme": "int4-weight-only", "group_size": 64})) == 64
    assert gpt_fast_int4_group(manifest({"scheme": "int8-weight-only", "group_size": None})) is None
    assert gpt_fast_int4_group(manifest({})) is None
    # a package built without --group-size records the groups it holds, and gets them too (its
    # contender once ran in bf16 for want of them)
    default = Quantization("int4-weight-only").record()
    assert gpt_fast_int4_group(manifest(default)) == DEFAULT_GROUP_SIZE


def test_bench_against_gpt_fast_times_it_and_refuses_other_families_in_its_row(
    generation_packages,
):
    from aotc.api import BenchConfig, bench

    package, _model = generation_packages["llama"]
    report = bench(BenchConfig(package=package, prompt_tokens=6, new_tokens=5, rounds=1,
                               against=("eager", "gpt-fast")))  # fmt: skip
    rows = {row["contender"]: row for row in report["results"]}
    assert rows["gpt-fast"]["tokens_equal"] is True and rows["gpt-fast"]["decode_tokens_per_s"] > 0
    package, _model = generation_packages["gpt2"]
    report = bench(BenchConfig(package=package, prompt_tokens=6, new_tokens=5, rounds=1,
                               against=("gpt-fast",)))  # fmt: skip
    rows = {row["contender"]: row for row in report["results"]}
    assert "written for LlamaForCausalLM" in rows["gpt-fast"]["error"]
    assert rows["package"]["decode_tokens_per_s"] > 0
