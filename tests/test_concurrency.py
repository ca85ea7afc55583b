"""One package called from many threads at once gives every caller the output a lone call gives;
state and CUDA graphs serialize; `aotc run --threads` reports throughput. (The GPU half, a
CUDA-graph package under 8 threads, is in test_gpu.py.)"""

from __future__ import annotations

import json
import sys
import threading

import torch
from conftest import invoke

import aotc_runtime

THREADS, CALLS = 8, 200


def call_from_threads(package, inputs_of, calls=CALLS, threads=THREADS) -> list:
    """Each thread makes `calls` calls, cycling through its own inputs; every output is returned."""
    outputs: list = [[] for _ in range(threads)]
    errors: list = []
    barrier = threading.Barrier(threads)

    def worker(index: int) -> None:
        try:
            torch.set_num_threads(aotc_runtime.intra_op_threads(threads))
            barrier.wait()
            mine = inputs_of(index)
            with torch.inference_mode():
                for call in range(calls):
                    outputs[index].append(package(*mine[call % len(mine)]))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert not errors, errors[0]
    return outputs


def test_eight_threads_get_what_one_thread_gets(packages):
    package = aotc_runtime.load(packages.get("mlp").package, threads=THREADS)
    generator = torch.Generator().manual_seed(0)
    inputs = [
        [(torch.randn(32, 128, generator=generator),) for _ in range(3)] for _ in range(THREADS)
    ]
    with torch.inference_mode():
        expected = [[package(*x) for x in per_thread] for per_thread in inputs]
    outputs = call_from_threads(package, lambda index: inputs[index])
    for index, per_thread in enumerate(outputs):
        assert len(per_thread) == CALLS
        for call, out in enumerate(per_thread):
            assert torch.equal(out, expected[index][call % 3]), (index, call)


def test_a_stateful_package_runs_one_call_at_a_time(packages):
    """The counter adds one per call: 1600 calls from 8 threads must see 1..1600, each once."""
    package = aotc_runtime.load(packages.get("counter").package, threads=4)
    x = torch.ones(2, 3)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a race shows up, not by luck
    try:
        outputs = call_from_threads(package, lambda index: [(x,)])
    finally:
        sys.setswitchinterval(interval)
    counts = sorted(out[0, 0].item() for per_thread in outputs for out in per_thread)
    assert counts == [float(n) for n in range(1, THREADS * CALLS + 1)]


def test_aotc_run_threads_reports_throughput(packages):
    result = invoke("run", packages.get("mlp").package, "--threads", "4", "--iters", "25", "--json")
    assert result.exit_code == 0, result.stderr
    many = json.loads(result.stdout)["concurrency"]
    assert many["threads"] == 4 and many["calls"] == 100 and many["calls_per_second"] > 0
    assert many["intra_op_threads"] == aotc_runtime.intra_op_threads(4)
    result = invoke("run", packages.get("mlp").package, "--threads", "0")
    assert result.exit_code == 2
    result = invoke("run", packages.get("mlp").package, "--threads", "2", "--engine", "cpp")
    assert result.exit_code == 2 and "--threads is for --engine python" in result.stderr
