"""Stage estimates: a prior before any run of a kind, this machine's rates after, and a record that
is only ever a hint (a damaged or foreign one gives no estimate and breaks nothing)."""

import json
import os

import pytest

from aotc.stage_estimates import (
    MAX_RECORD_BYTES,
    PRIOR,
    RATES_KEPT,
    RECORD_FILE,
    StageCost,
    StageEstimates,
    build_kind,
    describe,
)

CPU_GENERATION = build_kind("cpu", "default", "fp32", None, {"task": "text-generation"})


def test_before_any_run_the_prior_stands_in_and_unknown_kinds_have_no_estimate(tmp_path):
    estimates = StageEstimates(CPU_GENERATION, tmp_path)
    assert estimates.seconds("compile", 1000) == PRIOR[CPU_GENERATION]["compile"].seconds(1000)
    cuda = StageEstimates(build_kind("cuda", "max-autotune", "bf16", None, None), tmp_path)
    assert cuda.seconds("compile", 1000) is None


def test_a_succeeded_run_teaches_the_next_estimate_its_rate(tmp_path):
    first = StageEstimates(CPU_GENERATION, tmp_path)
    first.seconds("compile", 1000)
    fixed = PRIOR[CPU_GENERATION]["compile"].fixed
    first.record({"compile": fixed + 500.0})  # 0.5 s a node on this machine
    second = StageEstimates(CPU_GENERATION, tmp_path)
    assert second.seconds("compile", 2000) == pytest.approx(fixed + 1000.0)
    # a stage the run gave no work figure is not recorded
    first.record({"check": 99.0})
    assert "check" not in json.loads((tmp_path / RECORD_FILE).read_text())[CPU_GENERATION]


def test_the_estimate_is_the_median_of_the_last_rates(tmp_path):
    kind = build_kind("cuda", "default", "bf16", None, None)  # no prior: the rate is seconds / work
    for took in [1.0, 2.0, 3.0, 100.0, 4.0] + [5.0] * RATES_KEPT:
        run = StageEstimates(kind, tmp_path)
        run.seconds("lower", 1)
        run.record({"lower": took})
    rates = json.loads((tmp_path / RECORD_FILE).read_text())[kind]["lower"]
    assert rates == [5.0] * RATES_KEPT  # only the last RATES_KEPT kept
    run = StageEstimates(kind, tmp_path)
    assert run.seconds("lower", 10) == pytest.approx(50.0)


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2]",
        json.dumps({CPU_GENERATION: {"compile": ["x", -1, True, 1e300]}}).encode(),
        json.dumps({CPU_GENERATION: "nope"}).encode(),
        b"[" * 100_000,  # deep nesting
        b" " * (MAX_RECORD_BYTES + 1),
    ],
    ids=["text", "list", "bad-rates", "bad-stages", "deep", "huge"],
)
def test_a_damaged_record_gives_the_prior_and_is_replaced_by_a_good_one(tmp_path, content):
    (tmp_path / RECORD_FILE).write_bytes(content)
    estimates = StageEstimates(CPU_GENERATION, tmp_path)
    assert estimates.seconds("compile", 10) == PRIOR[CPU_GENERATION]["compile"].seconds(10)
    estimates.record({"compile": 100.0})
    assert json.loads((tmp_path / RECORD_FILE).read_text())[CPU_GENERATION]["compile"]


def test_a_record_that_cannot_be_written_is_no_error(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    estimates = StageEstimates(CPU_GENERATION, folder)
    estimates.seconds("compile", 10)
    os.chmod(folder, 0o500)
    try:
        estimates.record({"compile": 100.0})  # root may still write: either way, no error
    finally:
        os.chmod(folder, 0o700)
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_cache_folder_that_is_not_private_means_no_record(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    monkeypatch.setenv("AOTC_CACHE_DIR", str(shared))
    estimates = StageEstimates.for_this_machine(CPU_GENERATION)
    assert estimates.root is None
    estimates.seconds("compile", 10)
    estimates.record({"compile": 1.0})
    assert not (shared / RECORD_FILE).exists()


def test_estimates_read_as_a_person_says_them():
    assert [describe(s) for s in (0.2, 42, 61, 250, 7200)] == [
        "about 5s",
        "about 40s",
        "about 1 min",
        "about 4 min",
        "about 2.0 h",
    ]
    assert StageCost(2.0, 0.5).seconds(-10) == 2.0
