"""CPU threads: the default rule (aotc_runtime/threads.py, and the C++ runner's twin), `--threads`
reaching torch and the runner (their timings report what they ran with), bad values refused in
one line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import built_runner, invoke

from aotc_runtime.threads import (
    MAX_THREADS,
    cgroup_cpu_quota,
    chosen_threads,
    default_threads,
    parse_threads,
)


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """A command run in-process sets this process's threads: the next test gets them back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def fake_machine(root: Path, siblings: dict, cgroup: str = "0::/\n", files: dict | None = None):
    """A /sys and /proc under `root`: cpuN -> its core's CPU list, /proc/self/cgroup, other files."""
    for cpu, listed in siblings.items():
        topology = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
        topology.mkdir(parents=True)
        (topology / "core_cpus_list").write_text(listed + "\n")
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


# 2 cores of 2 hyper-threads each, numbered as Linux numbers them: cpu0/cpu2 one core, cpu1/cpu3 the other
SMT = {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}


@pytest.mark.parametrize(
    "allowed, expected",
    [({0, 1, 2, 3}, 2), ({0, 2}, 1), ({0, 1}, 2), ({3}, 1)],
    ids=["all", "one-core's-two-threads", "a-thread-of-each-core", "one-thread"],
)
def test_the_default_is_the_physical_cores_of_the_affinity_mask(tmp_path, allowed, expected):
    assert default_threads(fake_machine(tmp_path, SMT), allowed) == expected


def test_without_topology_every_allowed_cpu_counts(tmp_path):
    root = fake_machine(tmp_path, {0: "0"})  # cpu1..5 have no topology folder
    assert default_threads(root, {0, 1, 2, 3, 4, 5}) == 6
    # the older file name alone is enough
    older = tmp_path / "older"
    topology = older / "sys/devices/system/cpu/cpu0/topology"
    topology.mkdir(parents=True)
    (topology / "thread_siblings_list").write_text("0-1\n")
    (older / "sys/devices/system/cpu/cpu1/topology").mkdir(parents=True)
    (older / "sys/devices/system/cpu/cpu1/topology/thread_siblings_list").write_text("0-1\n")
    assert default_threads(older, {0, 1}) == 1


@pytest.mark.parametrize(
    "cgroup, files, quota",
    [
        ("0::/\n", {"sys/fs/cgroup/cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs: rounded up
        ("0::/\n", {"sys/fs/cgroup/cpu.max": "max 100000\n"}, None),
        # the process's own cgroup, and a parent's tighter limit, which holds for it too
        (
            "0::/jobs/a\n",
            {"sys/fs/cgroup/jobs/a/cpu.max": "300000 100000", "sys/fs/cgroup/jobs/cpu.max": "100000 100000"},
            1,
        ),
        # a host path the container's mount does not hold: the mount's own file counts
        ("0::/docker/abc\n", {"sys/fs/cgroup/cpu.max": "200000 100000"}, 2),
        # cgroup v1, under either mount name; -1: no quota
        (
            "4:cpu,cpuacct:/\n",
            {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "100000",
             "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000"},
            1,
        ),
        (
            "2:cpuacct:/\n1:cpu:/\n",
            {"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"},
            None,
        ),
        ("9:memory:/\n", {"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "100000"}, None),  # not the cpu controller
    ],
    ids=["v2", "v2-max", "v2-parent", "v2-container", "v1", "v1-none", "v1-other"],
)  # fmt: skip
def test_the_cgroup_quota_caps_the_default(tmp_path, cgroup, files, quota):
    root = fake_machine(tmp_path, SMT, cgroup, files)
    assert cgroup_cpu_quota(root) == quota
    assert default_threads(root, {0, 1, 2, 3}) == min(2, quota or 2)


@pytest.mark.parametrize(
    "loadavg, expected",
    [
        ("0.30 0.50 0.40 1/200 4242\n", 2),  # a quiet machine: every core
        (f"{(os.cpu_count() or 1) - 1}.20 0.50 0.40 3/200 4242\n", 1),  # one CPU left free
        (f"{(os.cpu_count() or 1) + 3}.00 4.0 4.0 7/200 4242\n", 1),  # busier than it has CPUs
        ("nan 0 0 1/1 1\n", 2),  # not a load: ignored
        ("-1 0 0 1/1 1\n", 2),
        ("", 2),
    ],
    ids=["quiet", "one-free", "overloaded", "nan", "negative", "empty"],
)
def test_the_default_leaves_out_the_cpus_other_work_keeps_busy(tmp_path, loadavg, expected):
    """Two threads where other processes keep the CPUs busy wait at every barrier for the thread
    the scheduler put aside: the default counts only the CPUs the load average leaves free."""
    root = fake_machine(tmp_path, SMT, files={"proc/loadavg": loadavg})
    assert default_threads(root, {0, 1, 2, 3}) == expected


@pytest.mark.parametrize("text", ["0", "-1", "2.5", "abc", "", str(MAX_THREADS + 1), "٣"])
def test_a_bad_thread_count_is_refused_in_words(text):
    with pytest.raises(ValueError, match=r"--threads must be a whole number from 1 to 1024"):
        parse_threads(text)


def test_a_thread_count_and_omp_num_threads(monkeypatch):
    assert parse_threads("3") == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert chosen_threads() == 3 and chosen_threads(1) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")  # not a count: the rule decides
    assert chosen_threads() == default_threads()


def test_generate_runs_with_the_threads_asked_for_and_says_so(generation_packages):
    package, _model = generation_packages["gpt2"]
    args = ("generate", package, "--prompt-ids", "5,17,42", "--max-new-tokens", 4)
    result = invoke(*args, "--threads", 1, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["timings"]["threads"] == 1
    text = invoke(*args, "--threads", 1)
    assert text.stderr.strip().endswith("; 1 CPU thread"), text.stderr
    default = invoke(*args, "--json")
    assert json.loads(default.stdout)["timings"]["threads"] == chosen_threads()


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
@pytest.mark.parametrize("value", ["0", "-2", "1.5"])
def test_each_command_refuses_a_bad_thread_count_in_one_line(command, value, tmp_path):
    before = default_threads()  # the load average may move between the command and the test
    result = invoke(command, tmp_path, "--threads", value)
    assert result.exit_code == 2
    lines = {
        f"error: --threads must be a whole number from 1 to 1024 (the CPU threads to use), got "
        f"'{value}'; leave it out for one thread per free physical core ({default} here now)"
        for default in (before, default_threads())
    }
    assert result.stderr.strip().splitlines()[0] in lines
    assert len(result.stderr.strip().splitlines()) == 1


def test_bench_runs_with_the_threads_asked_for(generation_packages, tmp_path):
    package, _model = generation_packages["gpt2"]
    out = tmp_path / "bench.json"
    quick = ("--prompt-tokens", 4, "--new-tokens", 3, "--rounds", 1, "--warmup", 0)
    result = invoke("bench", package, "--against", "none", *quick, "--threads", 1, "--json", out)
    assert result.exit_code == 0, result.stderr
    assert json.loads(out.read_text())["machine"]["torch_threads"] == 1
    assert "; 1 torch threads" in result.stdout


def run_runner(*args, affinity=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run(
        [str(built_runner()), *map(str, args)], capture_output=True, text=True, timeout=300,
        env=env, preexec_fn=(lambda: os.sched_setaffinity(0, affinity)) if affinity else None,
    )  # fmt: skip


def test_the_runner_generates_with_the_threads_asked_for(generation_packages):
    package, _model = generation_packages["gpt2"]
    args = (package, "--generate", "--prompt-ids", "5,17,42", "--max-new-tokens", 4)
    asked = run_runner(*args, "--threads", 1, "--json")
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["timings"]["threads"] == 1
    text = run_runner(*args, "--threads", 1)
    assert text.stderr.strip().endswith("; 1 CPU thread"), text.stderr
    refused = run_runner(*args, "--threads", "0")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert refused.stderr.startswith("error: --threads must be a whole number from 1 to 1024")


def test_the_runner_and_the_python_runtime_pick_the_same_default(generation_packages):
    """The same rule on both sides: on this machine, and on one CPU of it (the affinity mask)."""
    package, _model = generation_packages["gpt2"]
    args = (package, "--generate", "--prompt-ids", "5,17,42", "--max-new-tokens", 2, "--json")
    before = default_threads()  # the load average may move while the runner starts
    done = run_runner(*args)
    assert json.loads(done.stdout)["timings"]["threads"] in {before, default_threads()}
    one_cpu = {min(os.sched_getaffinity(0))}
    pinned = run_runner(*args, affinity=one_cpu)
    assert json.loads(pinned.stdout)["timings"]["threads"] == default_threads(allowed=one_cpu) == 1


@pytest.mark.parametrize(
    "gaps, threads, said",
    [
        ([10.0] * 95 + [100.0] * 5, 2, "rerun with --threads 1"),  # p99 10x the p50: stalls
        ([10.0] * 95 + [100.0] * 5, 1, "other work on this machine competes for its CPU"),
        ([10.0] * 95 + [30.0] * 5, 2, None),  # 3x: a long context's steps, not stalls
        ([1.0] * 95 + [6.0] * 5, 2, None),  # 6x but 5 ms: a fast device's jitter
        ([10.0] * 5 + [100.0] * 2, 2, None),  # too few tokens to tell
    ],
    ids=["stalls-2-threads", "stalls-1-thread", "3x", "small", "few"],
)
def test_a_run_whose_slowest_tokens_stall_says_so_with_the_flag_that_helps(gaps, threads, said):
    from aotc_runtime.timing import stall_note

    note = stall_note(gaps, threads)
    if said is None:
        assert note is None
    else:
        assert note == (
            "note: the slowest tokens took 10x the median one (p99 100.0 ms, p50 10.0 ms): "
            + ("rerun with --threads 1, or fewer threads than free cores" if threads > 1 else said)
        )


def test_the_gaps_between_token_stamps_are_in_milliseconds():
    from aotc_runtime.timing import gaps_ms

    assert gaps_ms([]) == [] and gaps_ms([3.0]) == []
    assert gaps_ms([1.0, 1.5, 1.502]) == pytest.approx([500.0, 2.0])
