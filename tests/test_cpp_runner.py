"""The C++ runner (runtime/cpp) against the Python runtime: same outputs, same refusals.

The runner is built once per session (`python -m aotc.deploy.cpp_runner build`, what `make runner` runs);
building it needs cmake, a C++ compiler, OpenSSL's and zlib's headers and the nlohmann-json package.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch

import aotc_runtime

ROOT = Path(__file__).resolve().parent.parent


def run_cpp(runner: Path, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(runner), *map(str, args)], capture_output=True, text=True, timeout=300, env=env
    )


def run_python(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aotc_runtime", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def python_outputs(package: Path, inputs: list) -> dict:
    loaded = aotc_runtime.load(package)
    with torch.inference_mode():
        outputs = aotc_runtime.flatten_outputs(loaded(*inputs))
    return dict(zip(loaded.signature.output_names, outputs))


def assert_same_outputs(npz: Path, expected: dict) -> None:
    with numpy.load(npz) as got:
        assert list(got.files) == list(expected), (got.files, list(expected))
        for name, want in expected.items():
            assert got[name].shape == tuple(want.shape), name
            assert numpy.abs(got[name] - want.numpy()).max(initial=0) <= 1e-6, name


@pytest.mark.parametrize("case", ["mlp", "two_input", "structured"])
def test_runner_matches_the_python_runtime(runner, packages, tmp_path, case):
    package = packages.get(case).package
    signature = aotc_runtime.load(package).signature
    inputs = signature.random_inputs(seed=3)
    numpy.savez(
        tmp_path / "in.npz", **{spec.name: t.numpy() for spec, t in zip(signature.inputs, inputs)}
    )
    result = run_cpp(
        runner, package, "--input", tmp_path / "in.npz", "--output", tmp_path / "out.npz", "--json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [o["name"] for o in report["outputs"]] == list(signature.output_names)
    assert_same_outputs(tmp_path / "out.npz", python_outputs(package, inputs))


def test_dynamic_batch_at_three_sizes(runner, packages, tmp_path):
    package = packages.get("dynamic_mlp").package
    for batch in (1, 17, 64):
        x = torch.randn(batch, 128, generator=torch.Generator().manual_seed(batch))
        numpy.save(tmp_path / "x.npy", x.numpy())
        result = run_cpp(
            runner, package, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npz"
        )
        assert result.returncode == 0, result.stderr
        assert_same_outputs(tmp_path / "y.npz", python_outputs(package, [x]))


def test_fortran_order_and_positional_npy_inputs(runner, packages, tmp_path):
    package = packages.get("two_input").package
    signature = aotc_runtime.load(package).signature
    inputs = signature.random_inputs(seed=5)
    paths = []
    for index, tensor in enumerate(inputs):
        paths += ["--input", tmp_path / f"{index}.npy"]
        numpy.save(tmp_path / f"{index}.npy", numpy.asfortranarray(tensor.numpy()))
    result = run_cpp(runner, package, *paths, "--output", tmp_path / "out.npz")
    assert result.returncode == 0, result.stderr
    assert_same_outputs(tmp_path / "out.npz", python_outputs(package, inputs))


def test_state_is_carried_between_calls(runner, packages, tmp_path):
    """counter.py adds to a buffer each call: the runner reads state.pt and the first call matches."""
    package = packages.get("counter").package
    x = torch.ones(2, 3)
    numpy.save(tmp_path / "x.npy", x.numpy())
    result = run_cpp(
        runner, package, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npz", "--iters", 3
    )
    assert result.returncode == 0, result.stderr
    assert_same_outputs(tmp_path / "y.npz", python_outputs(package, [x]))


def test_random_inputs_latency_and_report(runner, packages):
    result = run_cpp(runner, packages.get("mlp").package, "--iters", 20, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["inputs"] == "random (seed 0)" and report["latency"]["n"] == 20
    assert 0 < report["latency"]["median_ms"] <= report["latency"]["p99_ms"]
    assert set(report["load_breakdown_ms"]) == {"manifest", "device", "hashes", "loader", "state"}


def test_runner_does_not_link_libpython(runner):
    ldd = shutil.which("ldd")
    if ldd is None:
        pytest.skip("ldd not installed")
    linked = subprocess.run([ldd, str(runner)], capture_output=True, text=True, check=True).stdout
    assert "libtorch_cpu" in linked
    assert "libpython" not in linked and "libtorch_python" not in linked


def _edit_manifest(package: Path, edit) -> None:
    manifest = json.loads((package / "manifest.json").read_text())
    edit(manifest)
    (package / "manifest.json").write_text(aotc_runtime.hashed_manifest_text(manifest))


def _swap_model(package: Path, donor: Path) -> None:
    """Replace model.pt2 with another package's and update its hash, as an attacker would."""
    shutil.copy(donor / "model.pt2", package / "model.pt2")
    _edit_manifest(
        package,
        lambda m: m["files"].update({"model.pt2": aotc_runtime.sha256_file(package / "model.pt2")}),
    )


def _error_cases(packages, tmp_path) -> dict:
    """name -> (package folder, extra arguments): each a refusal both runtimes must make alike."""
    good = packages.get("mlp").package

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(good, target)
        return target

    numpy.save(tmp_path / "ok.npy", numpy.zeros((32, 128), numpy.float32))
    numpy.save(tmp_path / "int.npy", numpy.zeros((32, 128), numpy.int64))
    numpy.save(tmp_path / "short.npy", numpy.zeros((31, 128), numpy.float32))
    numpy.save(tmp_path / "rank.npy", numpy.zeros((32,), numpy.float32))
    numpy.save(tmp_path / "big.npy", numpy.zeros((32, 128), ">f4"))
    numpy.save(tmp_path / "dyn.npy", numpy.zeros((65, 128), numpy.float32))
    (tmp_path / "x.txt").write_text("1 2 3")
    cases = {
        "no folder": (tmp_path / "missing", []),
        "not a package": (tmp_path, []),
        "missing model": (copy("missing_model"), []),
        "edited model": (copy("edited_model"), []),
        "invalid json": (copy("invalid_json"), []),
        "bad dtype field": (copy("bad_dtype_field"), []),
        "no precision": (copy("no_precision"), []),
        "other torch": (copy("other_torch"), []),
        "cuda package": (copy("cuda_package"), []),
        "format 5": (copy("format_5"), []),
        "manifest edited": (copy("manifest_edited"), []),
        "manifest lies": (copy("manifest_lies"), []),
        "swapped model": (copy("swapped_model"), []),
        "path outside": (copy("path_outside"), []),
        "absurd dim": (copy("absurd_dim"), []),
        "unlisted file": (copy("unlisted_file"), []),
        "linked model": (copy("linked_model"), []),
        "unfinished": (copy("unfinished"), []),
        "two inputs given": (
            good,
            ["--input", tmp_path / "ok.npy", "--input", tmp_path / "ok.npy"],
        ),
        "wrong dtype": (good, ["--input", tmp_path / "int.npy"]),
        "wrong static size": (good, ["--input", tmp_path / "short.npy"]),
        "wrong rank": (good, ["--input", tmp_path / "rank.npy"]),
        "dim out of range": (
            packages.get("dynamic_mlp").package,
            ["--input", tmp_path / "dyn.npy"],
        ),
        "missing input file": (good, ["--input", tmp_path / "nothing.npy"]),
        "unknown input type": (good, ["--input", tmp_path / "x.txt"]),
    }
    (cases["missing model"][0] / "model.pt2").unlink()
    with open(cases["edited model"][0] / "model.pt2", "ab") as handle:
        handle.write(b"\0")
    (cases["invalid json"][0] / "manifest.json").write_text("{not json")
    _edit_manifest(
        cases["bad dtype field"][0], lambda m: m["signature"]["inputs"][0].update(dtype="complex32")
    )
    _edit_manifest(cases["no precision"][0], lambda m: m.pop("precision"))
    _edit_manifest(cases["other torch"][0], lambda m: m["toolchain"].update(torch="2.0.0+cpu"))
    _edit_manifest(
        cases["cuda package"][0],
        lambda m: m["device"].update(type="cuda", gpu_name="X", compute_capability="9.0"),
    )
    _edit_manifest(cases["format 5"][0], lambda m: m.update(format_version=5))
    edited = cases["manifest edited"][0] / "manifest.json"  # its own hash left as it was
    edited.write_text(edited.read_text().replace('"precision": "fp32"', '"precision": "tf32"'))
    _edit_manifest(cases["manifest lies"][0], lambda m: m.update(mode="max-autotune"))
    _swap_model(cases["swapped model"][0], packages.get("dynamic_mlp").package)
    _edit_manifest(cases["path outside"][0], lambda m: m["files"].update({"../x": "0" * 64}))
    _edit_manifest(
        cases["absurd dim"][0], lambda m: m["signature"]["inputs"][0].update(shape=[2**20, 2**20])
    )
    (cases["unlisted file"][0] / "notes.txt").write_text("x")
    _edit_manifest(cases["unfinished"][0], lambda m: m.update(numeric_check={"status": "pending"}))
    linked = cases["linked model"][0] / "model.pt2"
    linked.rename(tmp_path / "elsewhere.pt2")
    linked.symlink_to(tmp_path / "elsewhere.pt2")
    return cases


def test_error_cases_give_the_python_runtimes_exit_codes(runner, packages, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the 'cuda package' case assumes a machine without a GPU")
    from concurrent.futures import ThreadPoolExecutor

    cases = _error_cases(packages, tmp_path)
    # the two runtimes of every case, two processes at a time (each mostly waits on its own start)
    with ThreadPoolExecutor(2) as pool:
        python_runs = [
            pool.submit(run_python, package, *extra) for package, extra in cases.values()
        ]
        cpp_runs = [
            pool.submit(run_cpp, runner, package, *extra) for package, extra in cases.values()
        ]
    for name, python_run, cpp_run in zip(cases, python_runs, cpp_runs):
        python, cpp = python_run.result(), cpp_run.result()
        assert python.returncode in (7, 8), (name, python.returncode, python.stderr)
        assert cpp.returncode == python.returncode, (
            name,
            cpp.returncode,
            cpp.stderr,
            python.stderr,
        )
        lines = cpp.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, cpp.stderr)


def test_big_endian_npy_is_refused_with_the_fix(runner, packages, tmp_path):
    numpy.save(tmp_path / "big.npy", numpy.zeros((32, 128), ">f4"))
    result = run_cpp(runner, packages.get("mlp").package, "--input", tmp_path / "big.npy")
    assert (
        result.returncode == 8 and "big-endian" in result.stderr and "newbyteorder" in result.stderr
    )


def test_bad_command_line_is_exit_2(runner):
    for args in ([], ["pkg", "--iters", "x"], ["pkg", "--frobnicate"]):
        result = run_cpp(runner, *args)
        assert result.returncode == 2 and result.stderr.startswith("error: "), (args, result.stderr)


def test_embedding_example_builds_and_runs(runner, packages, generation_packages, tmp_path):
    """examples/cpp: a user's program linking aotc::runtime (load, call, read outputs), here the
    library `make runner` built (compiling the runtime again would take a minute on 2 cores)."""
    from aotc.deploy.cpp_runner import cmake_arguments

    build, library = tmp_path / "embed", runner.parent / "libaotc_runtime.a"
    assert library.is_file(), f"{library} is missing; `make runner` builds it"
    for step in (
        [
            "cmake",
            "-S",
            ROOT / "examples" / "cpp",
            "-B",
            build,
            *cmake_arguments(),
            f"-DAOTC_RUNTIME_LIBRARY={library}",
        ],  # fmt: skip
        ["cmake", "--build", build, "-j2"],
    ):
        result = subprocess.run(list(map(str, step)), capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    package = packages.get("mlp").package
    result = subprocess.run(
        [str(build / "embed"), str(package)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    name, shape, total = re.fullmatch(r"(\S+) (\[.*\]) sum (\S+)", result.stdout.strip()).groups()
    inputs = aotc_runtime.load(package).signature.random_inputs(seed=0)
    expected = python_outputs(package, inputs)["output_0"]
    assert name == "output_0" and shape == "[32, 10]"
    assert abs(float(total) - float(expected.sum())) <= 1e-4
    # a text-generation package: Package::generate with its per-token callback
    lm = generation_packages["gpt2"][0]
    result = subprocess.run(
        [str(build / "embed"), str(lm), "5,17,42"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    expected = aotc_runtime.load(lm).generate(torch.tensor([[5, 17, 42]]), max_new_tokens=8)
    new = expected[0, 3:].tolist()
    assert lines[:-1] == [f"token {t}" for t in new]
    assert lines[-1] == "generated " + " ".join(map(str, new))


def test_bundle_runs_with_no_python_and_an_empty_environment(runner, packages, tmp_path):
    from conftest import invoke

    package = packages.get("two_input").package
    bundle = tmp_path / "bundle"
    result = invoke("bundle", package, "-o", bundle, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["size_bytes"] > 0 and any(
        name.startswith("libtorch_cpu") for name in report["libraries"]
    )
    assert not any(name.startswith(("libc.so", "libpython")) for name in report["libraries"])
    signature = aotc_runtime.load(package).signature
    inputs = signature.random_inputs(seed=9)
    numpy.savez(
        tmp_path / "in.npz", **{spec.name: t.numpy() for spec, t in zip(signature.inputs, inputs)}
    )
    # No variables at all, and a PATH with no Python on it: only the bundle's own files are used.
    run = subprocess.run(
        [
            str(bundle / "run"),
            "--input",
            str(tmp_path / "in.npz"),
            "--output",
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": str(tmp_path / "empty")},
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert_same_outputs(tmp_path / "out.npz", python_outputs(package, inputs))
    again = invoke("bundle", package, "-o", bundle)
    assert again.exit_code == 2 and "--force" in again.stderr


def test_aotc_run_engine_cpp_agrees_with_python(runner, packages, tmp_path, monkeypatch):
    from conftest import invoke

    monkeypatch.setenv("AOTC_RUNNER", str(runner))
    package = packages.get("mlp").package
    numpy.save(
        tmp_path / "x.npy", numpy.random.default_rng(1).standard_normal((32, 128), numpy.float32)
    )
    for engine in ("python", "cpp"):
        result = invoke(
            "run",
            package,
            "--engine",
            engine,
            "--input",
            tmp_path / "x.npy",
            "--output",
            tmp_path / f"{engine}.npz",
        )
        assert result.exit_code == 0, result.stderr
    with numpy.load(tmp_path / "python.npz") as want, numpy.load(tmp_path / "cpp.npz") as got:
        assert numpy.abs(want["output_0"] - got["output_0"]).max() <= 1e-6
    refused = invoke("run", tmp_path / "nothing", "--engine", "cpp")
    assert refused.exit_code == 7 and refused.stderr.startswith("error: ")


def test_bench_against_cpp_interleaves_the_runner(runner, packages, tmp_path, monkeypatch):
    from conftest import invoke

    monkeypatch.setenv("AOTC_RUNNER", str(runner))
    out = tmp_path / "bench.json"
    result = invoke(
        "bench",
        packages.get("mlp").package,
        "--against",
        "cpp",
        "--iters",
        8,
        "--warmup",
        1,
        "--rounds",
        2,
        "--cold-runs",
        1,
        "--json",
        out,
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(out.read_text())
    rows = {row["contender"]: row for row in report["results"]}
    assert set(rows) == {"package", "cpp"} and rows["cpp"]["latency"]["n"] == 8
    assert rows["cpp"]["latency"]["median_ms"] > 0 and rows["cpp"]["first_call_ms"] > 0
    cold = {c["label"]: c for c in report["cold_start"]}
    assert cold["cpp"]["import_ms"] == 0 and cold["cpp"]["median_ms"] > 0


def test_a_state_file_claiming_a_huge_expanded_shape_is_refused_by_both_runtimes(
    runner, packages, tmp_path
):
    """An empty KV cache is saved as one value expanded: a crafted state.pt could claim any shape
    from one element, and the first clone would allocate it. Both runtimes compare each state
    tensor's shape and dtype with the manifest first (the manifest rehashed, as an attacker of an
    unsigned package would)."""
    from aotc.compiler.package_writer import write_manifest

    package = tmp_path / "counter_pkg"
    shutil.copytree(packages.get("counter").package, package)
    torch.save([torch.zeros(1).expand(1 << 20, 1 << 20)], package / "state.pt")  # 4 TiB claimed
    write_manifest(package, aotc_runtime.read_manifest(package))
    with pytest.raises(aotc_runtime.PackageError, match="manifest says float32") as refused:
        aotc_runtime.load(package)
    assert "\n" not in str(refused.value)
    result = subprocess.run(
        [str(runner), str(package)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 7, result.stderr
    assert "another shape or dtype than the manifest says" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


GENERATE_PROMPTS = (
    ["--prompt-ids", "5,17,42,9", "--prompt-ids", "7,8"],
    [[5, 17, 42, 9], [0, 0, 7, 8]],
)


def python_generate(package: Path, new_tokens: int, **sampling) -> list:
    ids = torch.tensor(GENERATE_PROMPTS[1])
    mask = (torch.arange(4) >= torch.tensor([[0], [2]])).long()
    got = aotc_runtime.load(package).generate(ids, mask, max_new_tokens=new_tokens, **sampling)
    return got[:, 4:].tolist()


@pytest.mark.parametrize("family", ["gpt2", "llama", "llama-four-rows"])
def test_runner_generates_the_python_runtimes_tokens(runner, generation_packages, family):
    """`aotc-runner --generate`, greedy and seeded sampling, token for token against the Python
    runtime on a left-padded batch of two prompts; four-rows: a package of 4 rows whose step both
    runtimes feed the prompts' 2 rows only."""
    if family == "llama-four-rows":
        package = generation_packages.four_rows("llama")[0]
    else:
        package = generation_packages[family][0]
    done = run_cpp(
        runner, package, "--generate", *GENERATE_PROMPTS[0], "--max-new-tokens", 12, "--json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["generated_ids"] == python_generate(package, 12)
    assert report["timings"]["decode_steps"] == 11 and report["timings"]["decode_tokens_per_s"] > 0
    sampled = ["--temperature", 0.9, "--top-k", 50, "--top-p", 0.95, "--seed", 7]
    done = run_cpp(
        runner,
        package,
        "--generate",
        *GENERATE_PROMPTS[0],
        "--max-new-tokens",
        12,
        "--json",
        *sampled,
    )
    assert done.returncode == 0, done.stderr
    expected = python_generate(package, 12, temperature=0.9, top_k=50, top_p=0.95, seed=7)
    assert json.loads(done.stdout)["generated_ids"] == expected


def test_runner_streams_one_line_per_step(runner, generation_packages):
    package = generation_packages["gpt2"][0]
    done = run_cpp(
        runner, package, "--generate", *GENERATE_PROMPTS[0], "--max-new-tokens", 5, "--stream"
    )
    assert done.returncode == 0, done.stderr
    steps = [list(map(int, line.split())) for line in done.stdout.strip().splitlines()]
    assert [list(row) for row in zip(*steps)] == python_generate(package, 5)
    assert "tokens/s" in done.stderr


def test_runner_reports_no_decode_rate_for_one_token(runner, generation_packages):
    """One new token is the prefill's alone: the runner's timing line says so, as `aotc generate`
    does, not a rate of 0 tokens/s over no steps."""
    done = run_cpp(
        runner, generation_packages["gpt2"][0], "--generate", *GENERATE_PROMPTS[0],
        "--max-new-tokens", 1,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no decode step after it (every sequence ended at its first token)" in done.stderr
    assert "tokens/s" not in done.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["--prompt-ids", "5,17,999"], "token id 999 is outside the vocabulary (0..511)"),
        (["--prompt-ids", "5", "--max-new-tokens", "40"], "ask for at most 31 new tokens"),
        (["--prompt-ids", "5,x"], "is not a comma-separated list of token ids"),
        (["--prompt-ids", "5", "--prompt-ids", "6", "--prompt-ids", "7"], "at most 2 at once"),
        (["--prompt-ids", ","], "a prompt is empty"),
        (
            ["--prompt-ids", "5", "--top-p", "0"],
            "--top-p must be a number from 1e-06 to 1, got '0'",
        ),
    ],
)
def test_runner_refuses_bad_generation_requests_in_one_line(
    runner, generation_packages, args, words
):
    done = run_cpp(runner, generation_packages["gpt2"][0], "--generate", *args)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_runner_refuses_generate_on_a_one_call_package(runner, packages):
    done = run_cpp(runner, packages.get("mlp").package, "--generate", "--prompt-ids", "1,2")
    assert done.returncode == 7 and "not a text-generation package" in done.stderr, done.stderr


def test_a_bundle_generates_with_no_python_and_an_empty_environment(
    runner, generation_packages, tmp_path
):
    """`aotc bundle` of a text-generation package generates under an empty environment."""
    from conftest import invoke

    package = generation_packages["gpt2"][0]
    bundle = tmp_path / "lm_bundle"
    result = invoke("bundle", package, "-o", bundle)
    assert result.exit_code == 0, result.stderr
    run = subprocess.run(
        [
            str(bundle / "run"),
            "--generate",
            *GENERATE_PROMPTS[0],
            "--max-new-tokens",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": str(tmp_path / "empty")},
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["generated_ids"] == python_generate(package, 8)
