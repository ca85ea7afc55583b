"""The lines that send a user on: the command named after a build or a bundle (and that it works
as printed), `make runner`'s progress, and the text-generation bench's headline agreeing with its
own per-token columns."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import torch
from conftest import invoke
from test_threads import run_runner

import aotc_runtime


def test_make_runner_shows_its_progress():
    """`make runner`'s build says each stage and passes on the build's own progress lines."""
    from aotc.deploy.cpp_runner import build_runner

    lines: list = []
    build_runner(progress=lines.append)
    assert lines[0].startswith("C++ runner 1/2: configuring (cmake")
    assert any(line.startswith("C++ runner 2/2: compiling") for line in lines)
    assert any(line.lstrip().startswith("[100%]") for line in lines), lines


def test_after_a_build_the_hint_names_the_command_that_works(generation_packages, packages):
    from aotc.cli.build import next_command

    package, _model = generation_packages["gpt2"]
    manifest = aotc_runtime.read_manifest(package)
    line = next_command(package, manifest)
    assert line == f"generate with it: aotc generate {package}/ --prompt-ids 5,17,42"
    command = line.removeprefix("generate with it: aotc ").split()
    assert invoke(*command, "--max-new-tokens", 2).exit_code == 0  # it works as printed
    with_tokenizer = dataclasses.replace(manifest.generation, tokenizer="tokenizer.json")
    assert next_command(package, dataclasses.replace(manifest, generation=with_tokenizer)) == (
        f"generate with it: aotc generate {package}/ --prompt 'Once upon a time'"
    )
    if "chat_template" in {f.name for f in dataclasses.fields(with_tokenizer)}:
        chat = dataclasses.replace(with_tokenizer, chat_template="chat_template.jinja")
        assert next_command(package, dataclasses.replace(manifest, generation=chat)) == (
            f"chat with it: aotc chat {package}/"
        )
    mlp = packages.get("mlp").package
    assert next_command(mlp, aotc_runtime.read_manifest(mlp)) == f"run it: aotc run {mlp}/"


def test_after_a_bundle_the_hint_names_the_command_that_works(generation_packages, packages):
    """The launcher passes its arguments to the runner: the hint's arguments, run by the runner
    on the package, work."""
    from aotc.deploy.bundle import run_command

    package, _model = generation_packages["gpt2"]
    line = run_command(Path("/srv/lm_bundle"), aotc_runtime.read_manifest(package))
    assert line == "/srv/lm_bundle/run --generate --prompt-ids 5,17,42 --max-new-tokens 16"
    done = run_runner(package, *line.split()[1:])
    assert done.returncode == 0 and len(done.stdout.split(",")) == 16, done.stderr
    mlp = packages.get("mlp").package
    line = run_command(Path("/srv/mlp_bundle"), aotc_runtime.read_manifest(mlp))
    assert line == (
        "/srv/mlp_bundle/run --iters 10  (random inputs; yours: --input x.npy --output out.npz)"
    )
    assert run_runner(mlp, "--iters", 10).returncode == 0


def timed(began: float, gaps_ms: list) -> SimpleNamespace:
    """A generation's stamps: the first token 5 ms after `began`, then the gaps."""
    stamps = [began + 0.005]
    for gap in gaps_ms:
        stamps.append(stamps[-1] + gap / 1e3)
    return SimpleNamespace(began=began, stamps=stamps, tokens=None)


def test_the_bench_headline_is_what_its_per_token_columns_say():
    """A package whose typical token takes 2.2 ms but that stalls 500 ms once a round (other work
    on the machine), against eager at a steady 10.5 ms: the mean rates are about equal (the
    headline read "1.01x"), the p50s 4.8x apart. The headline is the p50s' ratio, and the stall
    is named under the table."""
    from aotc.bench.generation import Measured, result_rows
    from aotc.bench.report import format_generation_table

    package_gaps = [2.2] * 62 + [500.0]
    eager_gaps = [10.5] * 63
    measured = Measured(
        {
            "package": [timed(0.0, package_gaps), timed(1.0, package_gaps)],
            "eager": [timed(2.0, eager_gaps), timed(3.0, eager_gaps)],
        }
    )
    for runs in measured.samples.values():
        for run in runs:
            run.tokens = torch.zeros(1, 64, dtype=torch.long)
    rows = {r["contender"]: r for r in result_rows(("package", "eager"), measured, 0, 64)}
    package, eager = rows["package"], rows["eager"]
    assert package["inter_token_ms"]["p50"] == 2.2 and eager["inter_token_ms"]["p50"] == 10.5
    assert package["decode_speedup_vs_eager"] == round(10.5 / 2.2, 2) == 4.77
    assert package["decode_tokens_per_s"] == round(1e3 / 2.2, 1)
    # the mean, stalls included, is there too: about eager's, as the old headline said
    assert 0.95 < package["decode_mean_tokens_per_s"] / eager["decode_mean_tokens_per_s"] < 1.1

    report = {
        "settings": {"new_tokens": 64, "prompt_tokens": 32, "warmup": 1, "rounds": 2, "timer": "t"},
        "package": {"path": "lm_pkg", "model": "lm.py", "device": {"type": "cpu"}, "mode": "default",
                    "precision": "fp32"},
        "created": "now",
        "machine": {"cpu": "x", "cpu_count": 2, "platform": "linux", "torch": "2", "python": "3",
                    "aotc": "0", "torch_threads": 2},
        "results": list(rows.values()),
    }  # fmt: skip
    table = format_generation_table(report)
    package_line = next(line for line in table.splitlines() if line.startswith("package "))
    assert package_line.split()[-1] == "4.77x" and " 2.200 " in package_line
    stall = [line for line in table.splitlines() if line.startswith("package: stalls")]
    assert stall == [
        "package: stalls: its mean rate is 0.22 of its typical token's (p99 500.0 ms): other work "
        "on this machine, or more CPU threads than free cores; rerun with fewer, --threads N"
    ]
    assert not any(line.startswith("eager: stalls") for line in table.splitlines())
