"""`aotc serve` from the command line (a request and its logged line, then SIGTERM), a stop that
hangs, and two replicas with the package shipped through Ray (what `--address` does): `--check`'s
request, and a replica killed mid-load.

What a killed replica's requests get: the ingress sends each again to a live replica (a request is
idempotent), so every accepted request is answered, and answered right; Ray starts a replacement.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy
import pytest

pytest.importorskip("ray.serve")

from conftest import free_port  # noqa: E402

from aotc_runtime import load  # noqa: E402
from aotc_runtime.serve.app import ServeOptions, descendants, start, stop  # noqa: E402
from aotc_runtime.serve.client import Client  # noqa: E402
from aotc_runtime.serve.command import check_once  # noqa: E402
from tests.test_serve import request_rows  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlp(packages):
    return packages.get("dynamic_mlp").package


def test_serve_answers_logs_the_request_and_stops_cleanly_on_sigterm(mlp):
    """`aotc serve` from the command line answers a request, and its line comes from the ingress
    replica to this terminal (not the server's own requests asking whether each route answers).
    SIGTERM (what Docker and systemd send) then takes the deployment down like Ctrl-C, exit 0;
    Ray's own handler would end the process on the spot with a native stack dump. One server for
    both: each start of Ray costs about 20 s of this file's time on CI's 2-core VM."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "aotc", "serve", str(mlp), "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
    )
    reply = None
    try:
        seen = []
        for line in process.stderr:  # up once it says how to stop it (it gives up within 300 s)
            seen.append(line)
            if "Ctrl-C stops it" in line:
                client = Client(f"http://127.0.0.1:{port}")
                reply = client.predict({"x": request_rows(0)})
                client.close()
                break
        process.send_signal(signal.SIGTERM)
        try:
            _, rest = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            _, rest = process.communicate()
            pytest.fail("still running 120 s after SIGTERM:\n" + ("".join(seen) + rest)[-3000:])
    finally:
        process.kill()
    stderr = "".join(seen) + rest
    assert process.returncode == 0, stderr[-2000:]
    assert "Ctrl-C stops it" in stderr and "stopping" in stderr and "SIGTERM received" not in stderr
    assert reply is not None and reply.status == 200, (reply and reply.body[:300], stderr[-2000:])
    # the last lines of the request log are taken as the server stops
    lines = re.findall(r"^\d\d:\d\d:\d\d (?:GET|POST) .*$", stderr, re.MULTILINE)
    assert len(lines) == 1 and re.fullmatch(r"\S+ POST /v1/predict 200 [\d.]+m?s", lines[0]), (
        stderr[-2000:]
    )


HANGING_STOP = """
import json, sys, time
from pathlib import Path
from aotc_runtime.serve.command import end_after
from aotc_runtime.serve.app import ServeOptions, descendants, start
import os
start(ServeOptions(package=Path(sys.argv[1]), port=int(sys.argv[2])))
print(json.dumps(descendants(os.getpid())), flush=True)
end_after(1)
time.sleep(600)  # a stop that hangs
"""


def test_a_stop_that_hangs_ends_with_every_process_it_started(mlp):
    """The fallback behind a SIGTERM'd server whose Ray shutdown hangs: the process ends all the
    same, and takes Ray's processes (its agents too, which do not share its fate) with it."""
    done = subprocess.run(
        [sys.executable, "-c", HANGING_STOP, str(mlp), str(free_port())],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "warning: Ray did not stop within 1 s" in done.stderr
    started = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(started) >= 3  # GCS, raylet, agents, workers
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in started if os.path.exists(f"/proc/{pid}")]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert not alive, f"still running: {alive}"


@pytest.fixture(scope="module")
def server(mlp):
    own_print = builtins.print
    running = start(ServeOptions(package=mlp, port=free_port(), replicas=2, threads=1, ship=True))
    yield running
    stop(running)
    # Ray replaced the process's print() with its own while it ran here (seen after a replica was
    # killed) and leaves it after ray.shutdown; stop() puts the process's back: a model with a
    # print() exported later in the process traced Ray's, and `aotc explain` reported it
    assert builtins.print is own_print


def test_check_answers_one_request_of_the_example_batch(server, capsys):
    """What `aotc serve --check` does once the server is up (aotc_runtime/serve/command.py), here
    on the module's server instead of a Ray of its own; the flag from the command line to its exit
    code on a cluster: tests/test_serve_cluster.py."""
    assert check_once(server) == 0
    stdout = capsys.readouterr().out
    assert "POST /v1/predict -> 200" in stdout
    assert "'output_0': [16, 10]" in stdout  # the example batch of the B=1:64 export


def replica_states(url: str, want: int, timeout: float = 90.0) -> dict:
    """replica id -> health of the model replicas, asking until `want` distinct live ones
    answered."""
    client = Client(url)
    seen: dict = {}
    deadline = time.monotonic() + timeout
    while len(seen) < want and time.monotonic() < deadline:
        reply = client.request("GET", "/v1/health")
        if reply.status == 200:
            state = reply.json()
            seen[state["replica"]] = state
        else:
            time.sleep(0.2)
    return seen


def model_replica_pids() -> list[int]:
    """The model replicas' processes (/v1/health names no pid: it is no client's business)."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"aotc-model" in cmdline.read():
                    found.append(pid)
        except OSError:  # ended meanwhile
            pass
    return found


def test_replicas_run_a_shipped_copy_and_leave_no_copy_behind(server, mlp):
    """Each replica removes its copy once it has read it: Ray ends a replica by killing its
    process, so a copy kept until then was left in the temp folder at every start."""
    import tempfile

    states = replica_states(server.url, want=2)
    assert len(states) == 2
    for state in states.values():
        assert state["status"] == "ok"
        assert state["shipped"] is True
    manifest = (mlp / "manifest.json").read_bytes()
    left = [
        folder
        for folder in Path(tempfile.gettempdir()).glob("aotc-serve-*")
        if (folder / "manifest.json").is_file()
        and (folder / "manifest.json").read_bytes() == manifest
    ]
    assert not left, left


def test_a_killed_replica_loses_no_request_and_is_replaced(server, mlp):
    package = load(mlp)
    before = replica_states(server.url, want=2)
    pids = model_replica_pids()
    assert len(pids) == 2, pids
    victim = sorted(pids)[0]
    inputs = [request_rows(5000 + seed) for seed in range(200)]
    answered = threading.Semaphore(0)
    local = threading.local()

    def send(x):
        if not hasattr(local, "client"):
            local.client = Client(server.url, timeout=120)
        reply = local.client.predict({"x": x})
        answered.release()
        time.sleep(0.01)  # spread the load over the kill
        return reply

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(send, x) for x in inputs]
        for _ in range(40):  # mid-load: 40 answered, 160 to go
            assert answered.acquire(timeout=120)
        os.kill(victim, signal.SIGKILL)
        replies = [f.result(timeout=300) for f in futures]
    failed = [(r.status, r.body[:200]) for r in replies if r.status != 200]
    assert not failed, failed[:3]
    for x, reply in zip(inputs, replies):
        numpy.testing.assert_allclose(
            reply.outputs()["output_0"], package(x).numpy(), rtol=1e-5, atol=1e-6
        )
    replaced = replica_states(server.url, want=2, timeout=120)
    assert len(replaced) == 2 and set(replaced) - set(before), (sorted(before), sorted(replaced))
    assert victim not in model_replica_pids()
