"""`aotc serve --address`: the command deploys on a running Ray cluster (here a one-node cluster
started for the test with `ray start --head --block`), ships the package through Ray and answers.
The cluster is stopped by ending its `ray start` process, never with `ray stop` (which would stop
every Ray on the machine)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray.serve")

from conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow


NODE = "127.0.0.1"  # the cluster's node address: loopback only, as every test here


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray = shutil.which("ray", path=os.path.dirname(sys.executable))
    if ray is None:
        pytest.skip("the ray command is not installed beside this Python")
    client_port, gcs_port = free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    # The head drains its node on SIGTERM (Ray >= 2.60) before it stops: with the whole process
    # group signalled its GCS is gone, so it waits out the drain's 30 s timeout. A test cluster
    # has no traffic to drain: 0 turns that off and the head stops at once, as before.
    head_env = {**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    log = tmp_path_factory.mktemp("ray-head") / "head.log"
    head = subprocess.Popen(
        [ray, "start", "--head", "--block", "--port", str(gcs_port), "--num-cpus", "2",
         "--ray-client-server-port", str(client_port), "--include-dashboard", "false",
         "--node-ip-address", NODE, "--temp-dir", str(tmp_path_factory.mktemp("ray"))],
        env=head_env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    address = f"ray://{NODE}:{client_port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the client server listens once the head is up
        try:
            socket.create_connection((NODE, client_port), timeout=2).close()
            break
        except OSError:
            time.sleep(1)
    else:
        stop_head(head)
        pytest.fail(f"the Ray head never listened on {address}: {log.read_text()[-1500:]}")
    yield address, env, log
    stop_head(head)


def stop_head(head: subprocess.Popen) -> None:
    """End `ray start --block` and the cluster it started (its process group)."""
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def http_port() -> int:
    """The port of the cluster's Serve: it keeps the one it first started with while it runs."""
    return free_port()


def serve_on(cluster, package, port: int) -> subprocess.CompletedProcess:
    address, env, _log = cluster
    return subprocess.run(
        [sys.executable, "-m", "aotc", "serve", str(package), "--address", address,
         "--host", NODE, "--port", str(port), "--check"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_serve_on_a_cluster_ships_the_package_and_answers(cluster, http_port, packages):
    mlp = packages.get("dynamic_mlp").package
    result = serve_on(cluster, mlp, http_port)
    assert result.returncode == 0, (
        result.stderr[-2000:] + "\nhead: " + cluster[2].read_text()[-1000:]
    )
    assert "POST /v1/predict -> 200" in result.stdout
    assert f"serving {mlp} at http://{NODE}:" in result.stderr
    # the request's line, from a replica of the cluster's to this terminal, through Ray Client
    line = r"^\S+ POST /v1/predict 200 \S+$"
    assert re.search(line, result.stderr, re.MULTILINE), result.stderr[-2000:]


def test_serve_on_a_cluster_answers_completions_and_refuses_another_port(
    cluster, http_port, generation_packages
):
    """A text-generation package behind `--address`, its completion (`--check`: 4 greedy tokens
    after token 1) equal to the runtime's own `generate` here. Serve stays up on the cluster
    afterwards, on its port: a server asked for another is refused in one line (Ray only warns and
    ignores it, and the server waited on a port nobody listens on)."""
    from tests.test_serve_completions import expected_ids

    lm = generation_packages["gpt2"][0]
    result = serve_on(cluster, lm, http_port)
    assert result.returncode == 0, (
        result.stderr[-2000:] + "\nhead: " + cluster[2].read_text()[-1000:]
    )
    assert "POST /v1/completions -> 200" in result.stdout
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["choices"][0]["token_ids"] == expected_ids(lm, [1], 4)
    line = r"^\S+ POST /v1/completions 200 prompt=1 completion=4 ttft=\S+ [\d.]+ tok/s \S+$"
    assert re.search(line, result.stderr, re.MULTILINE), result.stderr[-2000:]

    refused = serve_on(cluster, lm, free_port())
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert f"already answers HTTP on {NODE}:{http_port}" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert (
        "is ignored" not in refused.stderr
    )  # checked before Serve is asked, not after its warning


class FlakyRay:
    """ray's init/shutdown as a head whose client server fails to start `failures` times."""

    def __init__(self, failures: int, message: str = "Starting Ray client server failed."):
        self.failures, self.message, self.calls = failures, message, []

    def init(self, **settings):
        self.calls.append("init")
        if self.failures:
            self.failures -= 1
            raise ConnectionAbortedError(f"Initialization failure from server:\n{self.message}")

    def shutdown(self):
        self.calls.append("shutdown")


def test_a_client_server_that_fails_to_start_is_connected_to_again(monkeypatch):
    from aotc_runtime.serve import app

    monkeypatch.setattr(app.time, "sleep", lambda _s: None)
    ray = FlakyRay(failures=2)
    app._ray_init(ray, remote=True, address="ray://head:10001")
    assert ray.calls == ["init", "shutdown", "init", "shutdown", "init"]
    with pytest.raises(ConnectionAbortedError):  # three failures: the last one is the answer
        app._ray_init(FlakyRay(failures=3), remote=True, address="ray://head:10001")
    zombie = FlakyRay(
        failures=1, message="psutil.ZombieProcess: PID still exists but it's a zombie"
    )
    app._ray_init(zombie, remote=True, address="ray://head:10001")  # the same failure, seen later
    assert zombie.calls == ["init", "shutdown", "init"]
    other = FlakyRay(failures=1, message="wrong password")
    with pytest.raises(ConnectionAbortedError):  # any other failure: at once
        app._ray_init(other, remote=True, address="ray://head:10001")
    assert other.calls == ["init"]
