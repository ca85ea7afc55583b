"""`aotc serve` on a local Ray, over loopback: answers against `aotc run`'s, batching, refusals.

One server for the module (Ray and its replica start once: ~15 s on 2 cores). Request loops are
bounded: a fixed number of requests from a fixed number of client threads, each with a timeout.
"""

from __future__ import annotations

import io
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy
import pytest
import torch
from conftest import free_port

pytest.importorskip("ray.serve")

from aotc_runtime import PackageError, load  # noqa: E402
from aotc_runtime.serve.app import ServeOptions, check_package, start, stop  # noqa: E402
from aotc_runtime.serve.client import Client  # noqa: E402
from aotc_runtime.serve.protocol import NPZ_TYPE  # noqa: E402

pytestmark = pytest.mark.slow
CLIENT_THREADS = 16


@pytest.fixture(scope="module")
def mlp(packages):
    return packages.get("dynamic_mlp").package  # examples/mlp.py, B=1:64


@pytest.fixture(scope="module")
def server(mlp):
    options = ServeOptions(
        package=mlp, port=free_port(), max_batch_size=16, batch_wait_ms=20, metrics_port=free_port()
    )
    running = start(options)
    yield running
    stop(running)


def request_rows(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 5, (1,), generator=generator))
    return torch.randn(rows, 128, generator=generator)


def send_all(url: str, inputs: list, as_npz: bool = False) -> list:
    """Each input as one request, from CLIENT_THREADS threads (one connection each)."""
    local = threading.local()

    def send(x):
        if not hasattr(local, "client"):
            local.client = Client(url, timeout=60)
        return local.client.predict({"x": x}, as_npz=as_npz)

    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        return list(pool.map(send, inputs))


def health(url: str) -> dict:
    return Client(url).request("GET", "/v1/health").json()


def test_200_concurrent_requests_answer_as_aotc_run(server, mlp):
    package = load(mlp)
    name = package.signature.input_names[0]
    assert name == "x"
    inputs = [request_rows(seed) for seed in range(200)]
    before = health(server.url)
    replies = send_all(server.url, inputs)
    assert [r.status for r in replies] == [200] * 200, replies[0].body[:300]
    for x, reply in zip(inputs, replies):
        got = reply.outputs()["output_0"]
        expected = package(x).numpy()
        assert got.shape == expected.shape
        # rows joined into one call may take another GEMM blocking than alone: float32 rounding
        numpy.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    after = health(server.url)
    requests = after["requests"] - before["requests"]
    calls = after["calls"] - before["calls"]
    assert requests == 200
    assert calls < requests, f"no batching: {calls} calls for {requests} requests"


def test_batched_answers_equal_unbatched_ones(server):
    inputs = [request_rows(1000 + seed) for seed in range(48)]
    client = Client(server.url)
    one_by_one = [client.predict({"x": x}).outputs()["output_0"] for x in inputs]
    batched = [r.outputs()["output_0"] for r in send_all(server.url, inputs)]
    for alone, joined in zip(one_by_one, batched):
        numpy.testing.assert_allclose(joined, alone, rtol=1e-5, atol=1e-6)


def test_npz_in_and_out(server, mlp):
    x = request_rows(7)
    reply = Client(server.url).predict({"x": x}, as_npz=True)
    assert reply.status == 200 and reply.content_type.startswith(NPZ_TYPE)
    numpy.testing.assert_allclose(reply.outputs()["output_0"], load(mlp)(x).numpy(), rtol=1e-6)


def test_answers_say_where_their_time_went(server):
    reply = Client(server.url).predict({"x": request_rows(3)})
    stages = reply.timings()
    assert set(stages) == {"read", "decode", "replica", "queued", "call", "encode"}
    assert 0 < stages["call"] <= stages["replica"] <= reply.seconds * 1000
    assert 'batch;desc="' in reply.server_timing


def test_metadata_and_health(server):
    client = Client(server.url)
    meta = client.request("GET", "/v1/metadata").json()
    assert meta["signature"]["inputs"][0]["shape"] == ["B", 128]
    assert meta["batching"] == {"dim": "B", "max_rows": 16, "wait_ms": 20}
    assert meta["device"]["type"] == "cpu" and meta["backend"] == "aotinductor"
    state = client.request("GET", "/v1/health").json()
    assert state["status"] == "ok" and state["batch_dim"] == "B"


def malformed_requests() -> dict:
    npz = io.BytesIO()
    numpy.savez(npz, x=numpy.zeros((2, 128), dtype=numpy.float64))
    return {
        "bad JSON": (b'{"inputs": [', "application/json", 400, "not valid JSON"),
        "wrong shape": (json.dumps({"inputs": {"x": [[1.0] * 7]}}).encode(), "", 400, "dim 1"),
        "wrong dtype": (npz.getvalue(), NPZ_TYPE, 400, "must be float32"),
        "empty body": (b"", "application/json", 400, "empty request body"),
        "huge body": (b"0" * (65 << 20), "application/json", 413, "above this server's limit"),
        "batch above range": (
            json.dumps({"inputs": {"x": [[0.0] * 128] * 65}}).encode(),
            "",
            400,
            "outside 1..64",
        ),
        "other media type": (b"x", "text/plain", 415, "not served"),
    }


@pytest.mark.parametrize("case", list(malformed_requests()))
def test_malformed_requests_get_4xx_and_the_server_keeps_serving(server, case):
    body, content_type, status, words = malformed_requests()[case]
    client = Client(server.url)
    reply = client.request("POST", "/v1/predict", body, content_type)
    assert reply.status == status, reply.body[:300]
    error = reply.json()["error"]
    assert words in error["message"] and "\n" not in error["message"], error
    assert error["type"] == "invalid_request_error" and set(error) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert client.predict({"x": torch.ones(1, 128)}).status == 200


def test_metrics_have_batch_sizes_and_ray_serves_own(server):
    """Ray's Prometheus endpoint: aotc's batch histograms beside Ray Serve's request metrics."""
    import time
    import urllib.request

    client = Client(server.url)
    for seed in range(5):
        assert client.predict({"x": request_rows(seed)}).status == 200
    url = f"http://127.0.0.1:{server.options.metrics_port}/metrics"
    deadline, text = time.monotonic() + 60, ""
    while time.monotonic() < deadline:  # Ray exports every few seconds
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        if "ray_aotc_batch_rows_bucket" in text and "ray_serve_num_http_requests" in text:
            break
        time.sleep(2)
    assert "ray_aotc_batch_rows_bucket" in text and "ray_aotc_batch_requests_bucket" in text
    assert "ray_serve_num_http_requests" in text


def test_unknown_route_and_wrong_method(server):
    client = Client(server.url)
    assert client.request("GET", "/v2/predict").status == 404
    reply = client.request("GET", "/v1/predict")
    assert reply.status == 405 and "takes POST" in reply.json()["error"]["message"]


def test_a_replica_that_cannot_load_the_package_refuses_with_the_reason(server, mlp, tmp_path):
    """What a replica on an incompatible machine does: it stays up, and health and every request
    say why (constructed directly: the driver's own check would refuse this package first)."""
    import shutil

    from aotc_runtime.serve.replica import ModelReplica, ReplicaSettings
    from aotc_runtime.serve.shipping import PackageSource

    damaged = tmp_path / "damaged"
    shutil.copytree(mlp, damaged)
    model_file = next(p for p in damaged.rglob("*.pt2"))
    model_file.write_bytes(model_file.read_bytes()[:-10] + b"0123456789")
    replica = ModelReplica(PackageSource(path=str(damaged)), ReplicaSettings())
    assert replica.health()["status"] == "refused" and "reason" not in replica.health()
    reason = replica.refusal()  # what `aotc serve` prints, asked of the replica through Ray
    assert "refused the package" in reason and "modified" in reason


def test_a_stateful_package_is_refused_for_several_replicas(packages):
    counter = packages.get("counter").package
    with pytest.raises(PackageError, match="--replicas 1"):
        check_package(ServeOptions(package=counter, replicas=2))


def test_cli_refusals_before_ray_starts(packages, tmp_path):
    """Each bad start is one line and its documented exit code, before Ray starts: nothing runs."""
    from tests.conftest import invoke

    result = invoke("serve", tmp_path / "missing_pkg", "--check")
    assert result.exit_code == 7
    assert "error: package folder" in result.stderr and "does not exist" in result.stderr

    counter = packages.get("counter").package
    result = invoke("serve", counter, "--replicas", "2", "--check")
    assert result.exit_code == 7 and "serve it with --replicas 1" in result.stderr

    mlp = packages.get("dynamic_mlp").package
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = invoke("serve", mlp, "--port", port, "--check")
    assert result.exit_code == 2
    assert f"error: cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "--port" in result.stderr and "Traceback" not in result.stderr
