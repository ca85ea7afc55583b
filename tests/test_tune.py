"""`aotc build --tune` and `--specialize` on the CPU: the search's record, the members' numeric
checks and dispatch, the cache, the budget, and a candidate or a size that fails.

The tuned package is built once per session from the dynamic MLP (B=1:64) with two candidates
(Inductor and ONNX Runtime) and members at B=1 and B=8: six child builds. No timing is asserted:
which candidate wins is the machine's business; that every model answers as eager does is ours.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import eager_model, invoke

import aotc_runtime
from aotc.tune import search

STATUSES = {"chosen", "slower", "failed", "over tolerance", "skipped", "not tried", "cut off"}


@pytest.fixture(scope="session")
def tune_cache(tmp_path_factory):
    """One cache for the session's searches, never the user's ~/.cache (children inherit it)."""
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("tune-cache")
        patch.setenv("AOTC_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="session")
def tuned(packages, tune_cache, tmp_path_factory) -> Path:
    artifact = packages.get("dynamic_mlp").artifact
    output = tmp_path_factory.mktemp("tuned") / "pkg"
    result = invoke(
        "build", artifact, "--device", "cpu", "-o", output, "--tune",
        "--tune-candidates", "onnxruntime", "--specialize", "B=1,8", "--tune-jobs", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "search: 6 build(s) (0 from the cache)" in result.stdout
    return output


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_every_model_of_the_package_answers_as_eager_does(tuned):
    package = aotc_runtime.load(tuned)
    assert sorted(package.specializations) == ["B=1", "B=8"]
    model = eager_model("dynamic_mlp")
    for batch, runs in ((1, "specialized/B-1"), (3, "."), (8, "specialized/B-8"), (64, ".")):
        x = torch.randn(batch, 128)
        target = package.route(x)
        assert target.path.relative_to(package.path).as_posix() == runs
        with torch.no_grad():
            torch.testing.assert_close(package(x), model(x), atol=1e-4, rtol=1e-4)


def test_verify_reruns_every_members_check(tuned):
    result = invoke("verify", tuned, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert sorted(report["numeric_check"]["members"]) == ["B=1", "B=8"]
    numeric = next(c for c in report["checks"] if c["name"] == "numeric")
    assert "members B=1, B=8 run through the package's routing" in numeric["detail"]
    # each member answers to the user's artifact at its size, not to the static artifact it was
    # re-exported as (which the cache holds, and an attacker could replace)
    assert {"specialized at B=1", "specialized at B=8"} <= set(report["numeric_check"]["cases"])


def test_the_manifest_records_the_search(tuned):
    tuning = manifest(tuned)["tuning"]
    assert tuning["tuned"] and not tuning["cut_by_budget"] and tuning["dropped"] == []
    assert [v["dims"] for v in tuning["variants"]] == [{}, {"B": 1}, {"B": 8}]
    for variant in tuning["variants"]:
        candidates = variant["candidates"]
        assert [c["name"] for c in candidates] == ["inductor", "onnxruntime"]
        assert {c["status"] for c in candidates} == {"chosen", "slower"}
        chosen = next(c for c in candidates if c["status"] == "chosen")
        assert variant["chosen"] == chosen["name"]
        assert all(c["median_ms"] > 0 and c["build_seconds"] > 0 for c in candidates)
        # no candidate is more than MIN_GAIN faster than the one kept (ties keep the earlier)
        assert all(
            c["median_ms"] >= chosen["median_ms"] * (1 - search.MIN_GAIN) for c in candidates
        )
        # the member's package is the winner's build, with its own passed numeric check
        member = manifest(tuned / variant["package"])
        assert member["backend"] == chosen["backend"] and member["numeric_check"]["passed"]
        if variant["dims"]:
            assert member["signature"]["inputs"][0]["shape"] == [variant["dims"]["B"], 128]


def test_a_rerun_is_served_by_the_cache(tuned, packages, tmp_path):
    before = manifest(tuned)["tuning"]
    result = invoke(
        "build", packages.get("dynamic_mlp").artifact, "--device", "cpu", "-o", tmp_path / "again",
        "--tune", "--tune-candidates", "onnxruntime", "--specialize", "B=1,8", "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    again = manifest(tmp_path / "again")["tuning"]
    assert again["builds_from_cache"] == again["builds"] == 6
    assert again["timings_from_cache"] == 3
    assert [v["chosen"] for v in again["variants"]] == [v["chosen"] for v in before["variants"]]
    aotc_runtime.load(tmp_path / "again")


def test_a_spent_budget_keeps_the_first_build_and_says_so(packages, tmp_path, monkeypatch):
    monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / "cache"))
    result = invoke(
        "build", packages.get("dynamic_mlp").artifact, "--device", "cpu", "-o", tmp_path / "pkg",
        "--tune", "--tune-budget", "1s", "--specialize", "B=4",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "cut short by --tune-budget" in result.stdout
    tuning = manifest(tmp_path / "pkg")["tuning"]
    assert tuning["cut_by_budget"]
    first, *others = tuning["variants"][0]["candidates"]
    assert first["status"] == "chosen"
    assert {c["status"] for c in others} <= {"not tried", "cut off", "skipped"}
    # B=4 got no build in time: it is left out, and its calls run the dynamic model
    assert tuning["dropped"] and tuning["dropped"][0].startswith("B=4: runs the dynamic model")
    package = aotc_runtime.load(tmp_path / "pkg")
    assert package.specializations == {}
    assert package(torch.randn(4, 128)).shape == (4, 10)


def test_a_failing_candidate_and_a_failing_size_leave_the_rest(packages, tmp_path, monkeypatch):
    """A size whose every build fails is left out with the reason; a failed candidate is recorded."""
    monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / "cache"))
    real = search.build_command

    def broken_for_b2(cfg, trial, output):
        command = real(cfg, trial, output)
        return command + ["--option", "no_such_option=1"] if trial.variant.sizes else command

    monkeypatch.setattr(search, "build_command", broken_for_b2)
    result = invoke(
        "build", packages.get("dynamic_mlp").artifact, "--device", "cpu", "-o", tmp_path / "pkg",
        "--specialize", "B=2",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    tuning = manifest(tmp_path / "pkg")["tuning"]
    member = tuning["variants"][1]["candidates"][0]
    assert member["status"] == "failed" and "no_such_option" in member["reason"]
    assert (
        "B=2: runs the dynamic model; inductor: failed (unknown Inductor option"
        in (tuning["dropped"][0])
    )
    assert "left out B=2" in result.stdout
    assert aotc_runtime.load(tmp_path / "pkg").specializations == {}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--specialize", "S=4"], "has no dynamic dim S (its dynamic dims: B)"),
        (["--specialize", "B=65"], "outside B's range 1..64"),
        (["--specialize", "B=x"], "is not DIM=SIZE[,SIZE...]"),
        (["--tune-budget", "5m"], "go with --tune; add --tune"),
        (["--tune", "--tune-budget", "soon"], "is not a duration"),
        (["--tune", "--tune-candidates", "turbo"], "no candidate turbo for cpu"),
        (["--cudnn-benchmark"], "--cudnn-benchmark is a CUDA setting"),
        (["--fused-products"], "--fused-products is a CUDA text-generation setting"),
        (["--pdl"], "--pdl is a CUDA setting (compute capability 9.0 or later)"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(packages, tmp_path, flags, message):
    result = invoke(
        "build",
        packages.get("dynamic_mlp").artifact,
        "--device",
        "cpu",
        "-o",
        tmp_path / "p",
        *flags,
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "p").exists()


def test_specializing_a_stateful_or_static_model_is_refused(packages, tmp_path):
    result = invoke(
        "build", packages.get("counter").artifact, "--device", "cpu", "-o", tmp_path / "p",
        "--specialize", "B=1",
    )  # fmt: skip
    assert result.exit_code == 2 and "carries state between calls" in result.output
    result = invoke(
        "build", packages.get("mlp").artifact, "--device", "cpu", "-o", tmp_path / "p",
        "--specialize", "B=1",
    )  # fmt: skip
    assert result.exit_code == 2 and "every input shape is static" in result.output


def _rewrite(package: Path, edit) -> None:
    data = manifest(package)
    edit(data)
    data["files"] = aotc_runtime.hash_package_files(package)
    (package / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(data))


def test_the_runtime_refuses_a_member_that_is_not_the_model(tuned, tmp_path):
    package = tmp_path / "pkg"
    shutil.copytree(tuned, package)
    # a real, self-consistent package, but built for B=1: only the member check can tell
    shutil.rmtree(package / "specialized" / "B-8")
    shutil.copytree(tuned / "specialized" / "B-1", package / "specialized" / "B-8")
    _rewrite(package, lambda m: None)
    with pytest.raises(
        aotc_runtime.PackageError, match=r"member specialized/B-8 \(B=8\) is not"
    ) as error:
        aotc_runtime.load(package)
    assert "x float32[1, 128] where the package's at B=8 is x float32[8, 128]" in str(error.value)


@pytest.mark.parametrize(
    "specializations, message",
    [
        ([{"dims": {"S": 8}, "package": "specialized/B-8"}], "names dim S"),
        ([{"dims": {"B": 99}, "package": "specialized/B-8"}], "B=99, outside its range 1..64"),
        ([{"dims": {}, "package": "specialized/B-8"}], "non-empty object"),
        ([{"dims": {"B": 8}, "package": "../B-8"}], "not a plain path inside the package"),
        ([{"dims": {"B": 8}, "package": "specialized/B-9"}], "does not list"),
    ],
)
def test_the_runtime_refuses_bad_specializations(tuned, tmp_path, specializations, message):
    package = tmp_path / "pkg"
    shutil.copytree(tuned, package)
    _rewrite(package, lambda m: m.update(specializations=specializations))
    with pytest.raises(aotc_runtime.PackageError, match="not a valid manifest") as error:
        aotc_runtime.load(package)
    assert message in str(error.value)
