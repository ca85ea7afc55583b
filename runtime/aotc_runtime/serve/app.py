"""`aotc serve`: check a package, start Ray (locally, or join a cluster), deploy the ingress and the
model replicas on Ray Serve, wait until a replica answers, and take it all down again.

Two Ray Serve deployments (model composition, as Ray Serve's docs build it):
  HTTP proxy -> aotc-ingress (routes, checks, retries; runtime/aotc_runtime/serve/ingress.py)
             -> aotc-model (the package, dynamic batching; runtime/aotc_runtime/serve/replica.py)
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from aotc_runtime.errors import OptionError, ServeError
from aotc_runtime.serve.protocol import (
    COMPLETIONS_DEPLOYMENT,
    DEFAULT_MAX_ANSWER_BYTES,
    DEFAULT_MAX_BODY_BYTES,
    DRAIN_CHECK_S,
    MODEL_DEPLOYMENT,
)

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from aotc_runtime.manifest import Manifest

APP_NAME = "aotc"
REPLICA_LOGS = "the replica logs under /tmp/ray/session_latest/logs/serve/"
REFUSAL_TIMEOUT_S = 30.0
logger = logging.getLogger("aotc.serve")
START_TIMEOUT_S = 300.0
DEFAULT_BODY_TIMEOUT_S = 30.0  # `aotc serve --body-timeout-s`
# Ray takes the address its processes listen on from this flag: 0 is what Ray does on a laptop
# (macOS, Windows), the loopback address
RAY_CLUSTER_FLAG = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray Serve writes an access-log line per request in each replica by default: a cost on every
# request that Ray's own request metrics already cover. Warnings and errors are still logged.
QUIET_LOGS = {
    "enable_access_log": False,
    "log_level": "WARNING",
}  # a replica loads in seconds; a cold Ray cluster may take a minute or two


@dataclass(frozen=True)
class ServeOptions:
    package: Path
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    max_batch_size: int | None = None  # None: the package's largest specialized size, else 16
    batch_wait_ms: float = 5.0
    address: str | None = None  # a Ray cluster; None starts Ray on this machine
    gpus_per_replica: float | None = None  # None: 1 for a CUDA package, 0 for a CPU one
    threads: int | None = (
        None  # intra-op threads per replica; None: physical cores / replicas (CPU)
    )
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S  # a body must arrive within it, or 408
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES  # a completion's answer, whole or streamed
    ship: bool | None = None  # None: ship through Ray exactly when --address is given
    metrics_port: int | None = None  # local Ray's Prometheus endpoint (a cluster has its own)
    public_key: Path | None = None  # `--require-signature`: the package must be signed by its key
    prefix_cache: bool = True  # text generation: reuse the prompt starts the KV cache holds
    request_log: bool = (
        True  # one line per request, logged here (runtime/aotc_runtime/serve/request_log.py)
    )


@dataclass
class Server:
    """A running deployment: where it answers and what it runs."""

    url: str
    options: ServeOptions
    metadata: dict
    store: ActorHandle | None = None  # the PackageStore actor when the package was shipped
    started_ray: bool = False  # this process called ray.init (and disconnects at the end)
    local_ray: bool = False  # ... and that Ray is its own, on this machine (stopped at the end)
    # the process's print() before ray.init: Ray may put its own in place while it runs (seen after
    # a replica was killed) and leaves it after ray.shutdown, where a model exported later in the
    # process would trace Ray's print
    print_before_ray: Any = None
    health: dict = field(default_factory=dict)
    request_log: Any = None  # request_log.RequestLogFollower, with --request-log


def check_package(options: ServeOptions) -> Manifest:
    """The package's manifest, checked here before Ray starts: one clear error instead of N
    replicas failing. The machine check (torch, GPU) only when the replicas run on this machine.
    With a public key, the signature first (each replica checks it again as it loads: what it
    loads may not be what was checked here)."""
    from aotc_runtime import PackageError
    from aotc_runtime.environment import check_compatible
    from aotc_runtime.manifest import check_finished, read_manifest, verify_files

    path = options.package
    signed = None
    if options.public_key is not None:
        from aotc_runtime.signing import verify_signature

        signed = verify_signature(path, options.public_key)
    manifest = read_manifest(path, signed=signed)
    check_finished(path, manifest)
    verify_files(path, manifest)
    if options.address is None:
        check_compatible(manifest, path)
    # a text-generation package's state (its KV cache) lives for one generation, not across
    # requests: each replica has its own
    if manifest.signature.state and options.replicas > 1 and manifest.generation is None:
        raise PackageError(
            f"package {path} carries state between calls (signature.state), which lives in one "
            "replica; serve it with --replicas 1"
        )
    return manifest


def default_max_batch_size(manifest: Manifest) -> int:
    sizes = [size for spec in manifest.specializations for size in spec.dims.values()]
    return max(sizes) if sizes else 16


def metadata(manifest: Manifest, options: ServeOptions, max_batch_size: int) -> dict:
    """GET /v1/metadata: what is served and how."""
    from aotc_runtime.serve.batching import batch_dim, batch_limit

    signature = manifest.signature
    dim = batch_dim(signature) if max_batch_size > 1 else None
    # the folder's name, not its path: where the package lies on the server is not a client's business
    info: dict[str, Any] = {
        "model": Path(options.package).resolve().name,
        "aotc_version": manifest.aotc_version,
        "format_version": manifest.format_version,
        "torch": manifest.toolchain.torch,
        "device": manifest.device.to_json(),
        "mode": manifest.mode,
        "precision": manifest.precision,
        "backend": manifest.backend,
        "signature": signature.to_json(),
        "specializations": [spec.label for spec in manifest.specializations],
        "batching": {
            "dim": dim,
            "max_rows": batch_limit(signature, dim, max_batch_size) if dim else 1,
            "wait_ms": options.batch_wait_ms,
        },
        "replicas": options.replicas,
        "endpoints": ["POST /v1/predict", "GET /v1/health", "GET /v1/metadata"],
    }
    generation = manifest.generation
    if generation is not None:
        # the name clients give as "model" (and GET /v1/models lists): the package's folder
        info["generation"] = {
            "model": info["model"],
            "batch_size": generation.batch_size,
            "max_seq_len": generation.max_seq_len,
            "tokenizer": generation.tokenizer is not None,
            # what a request that names no sampling field gets: the model's generation_config
            "sampling_defaults": dataclasses.asdict(generation.default_sampling()),
        }
        info["batching"] = {"dim": None, "max_rows": generation.batch_size, "wait_ms": 0}
        chat = ["POST /v1/chat/completions"] if generation.chat_template is not None else []
        info["generation"]["chat_template"] = bool(chat)
        info["endpoints"] = [
            "POST /v1/completions", *chat, "GET /v1/models", "GET /v1/health", "GET /v1/metadata",
        ]  # fmt: skip
    return info


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # as the HTTP server binds: a port whose last connections are in TIME_WAIT (a server just
        # stopped) is free; only a socket listening there makes it busy
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OptionError(
                f"cannot listen on {host}:{port} ({exc.strerror}); pick another with --port or --host"
            ) from None


def _resources(options: ServeOptions, manifest: Manifest) -> tuple[int, float]:
    """(intra-op threads, GPUs) of each model replica."""
    cuda = manifest.device.type == "cuda"
    gpus = options.gpus_per_replica if options.gpus_per_replica is not None else float(cuda)
    if options.threads is not None:
        threads = options.threads
    elif cuda:
        threads = 1
    else:
        from aotc_runtime.threads import default_threads

        # the machine's physical cores this process may use, shared by the replicas
        share = default_threads() // options.replicas
        # A generating replica streams each token over HTTP from its event loop while its
        # thread runs steps back to back: intra-op threads on every core starve the loop and
        # Ray's proxy (2-core VM: 1,100-1,500 tokens/s with 2 threads, 2,300-2,650 with 1).
        generating = manifest.generation is not None
        threads = max(1, share - 1) if generating else max(1, share)
    if options.address is None and cuda and gpus > 0:
        import torch

        have = torch.cuda.device_count()
        if gpus * options.replicas > have:
            raise OptionError(
                f"{options.replicas} replica(s) x {gpus:g} GPU need {gpus * options.replicas:g} GPUs, "
                f"this machine has {have}; lower --replicas or share GPUs with --gpus-per-replica "
                f"{max(have, 1) / options.replicas:g}"
            )
    return threads, gpus


def start(options: ServeOptions) -> Server:
    """Deploy and return once a model replica answers /v1/health (or refused the package)."""
    import ray
    from ray import serve
    from ray.serve import Deployment

    from aotc_runtime.serve.completion_server import completion_deployment
    from aotc_runtime.serve.ingress import ingress_deployment
    from aotc_runtime.serve.replica import ModelReplica, ReplicaSettings
    from aotc_runtime.serve.request_log import RequestLogFollower
    from aotc_runtime.serve.shipping import PackageSource, ship

    manifest = check_package(options)
    threads, gpus = _resources(options, manifest)
    max_batch = options.max_batch_size or default_max_batch_size(manifest)
    local = options.address is None
    if local:
        _check_port_free(options.host, options.port)
    shipping = options.ship if options.ship is not None else not local
    started_ray = False
    print_before_ray = builtins.print
    problem = None
    try:
        if not ray.is_initialized():
            with caller_sigterm_handler(), ray_on_loopback(local):
                _ray_init(
                    ray,
                    remote=not local,
                    address="local" if local else options.address,
                    # a local Ray gets at least the CPUs the replicas ask for, so none waits forever
                    num_cpus=max(os.cpu_count() or 1, threads * options.replicas)
                    if local
                    else None,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                    **(
                        {"_metrics_export_port": options.metrics_port}
                        if local and options.metrics_port
                        else {}
                    ),
                )
            started_ray = True
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        # before serve.start, which on a cluster whose Serve runs would only warn that the host
        # and port asked for are ignored
        problem = None if local else _cluster_http_problem(options)
        if problem is None:
            serve.start(http_options={"host": options.host, "port": options.port})
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if started_ray:  # Ray came up but Serve did not: nothing of ours stays running
            _shutdown_ray(print_before_ray)
        raise ServeError(f"Ray could not start ({exc}); check --address and `ray status`") from None
    if problem:
        if started_ray:
            _shutdown_ray(print_before_ray)
        raise OptionError(problem)
    server = Server(
        f"http://{reachable_host(options)}:{options.port}",
        options,
        metadata(manifest, options, max_batch),
        started_ray=started_ray,
        local_ray=started_ray and local,
        print_before_ray=print_before_ray,
    )
    try:
        source = PackageSource(path=str(options.package.resolve()))
        if shipping:
            store_name = f"aotc-package-{uuid.uuid4().hex[:12]}"
            # detached on a cluster: the store outlives a dropped client connection, and
            # `aotc serve` removes it on exit
            server.store = ship(options.package, store_name, detached=not local)
            source = PackageSource(store_name=store_name)
        if options.request_log:
            server.request_log = RequestLogFollower()
        log_name = server.request_log.name if server.request_log is not None else None
        key = options.public_key.read_bytes() if options.public_key is not None else None
        settings = ReplicaSettings(
            max_batch, options.batch_wait_ms / 1000, threads, key, options.prefix_cache, log_name
        )
        cpus = 0 if gpus else threads
        if "generation" in server.metadata:
            # completions stream a token at a time: the replica answers HTTP itself
            app = completion_deployment(options.replicas, cpus, gpus, QUIET_LOGS).bind(
                source,
                settings,
                server.metadata,
                options.max_body_bytes,
                options.body_timeout_s,
                options.max_answer_bytes,
            )
        else:
            replica_deployment = serve.deployment(
                ModelReplica,
                name=MODEL_DEPLOYMENT,
                num_replicas=options.replicas,
                ray_actor_options={"num_cpus": cpus, "num_gpus": gpus},
                # serve.batch collects up to max_batch requests at once: each replica must
                # accept them
                max_ongoing_requests=max(32, 2 * max_batch),
                health_check_period_s=2,
                graceful_shutdown_wait_loop_s=DRAIN_CHECK_S,
                logging_config=QUIET_LOGS,
            )
            # given a class, serve.deployment returns a Deployment (Ray's types say a decorator)
            model = cast(Deployment, replica_deployment).bind(source, settings)
            retry = not manifest.signature.state
            app = ingress_deployment(options.replicas).bind(
                model, server.metadata, options.max_body_bytes, retry, options.body_timeout_s,
                log_name,
            )  # fmt: skip
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        server.health = wait_until_answering(server)
        if server.request_log is not None:
            server.request_log.start()
    except BaseException:  # Ctrl-C or no replica: take down what was started, then report
        stop(server)
        raise
    return server


def _cluster_http_problem(options: ServeOptions) -> str | None:
    """Why this server cannot listen where asked on a cluster whose Serve already runs (None if
    it can, or Serve does not run there yet): Serve's HTTP proxies keep the host and port of their
    first start, and `serve.start` only warns that new ones are ignored (the server would then
    wait on a port nobody listens on)."""
    # the running controller's HTTP options: ServeControllerClient.http_config (Ray 2.60, pinned)
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return None
    running = client.http_config
    if (running.host, running.port) == (options.host, options.port):
        return None
    return (
        f"the cluster's Ray Serve already answers HTTP on {running.host}:{running.port}, and keeps "
        f"that while it runs; pass --host {running.host} --port {running.port}, or shut Serve "
        "down there (`serve shutdown`)"
    )


# A Ray Client connection makes the head start a server process for it; that start can fail
# once while the next connection's works. CI saw it as "Starting Ray client server failed" (the
# process gone at once, its logs empty) and as the head's proxier tripping over that process
# already dead ("psutil.ZombieProcess" from its cmdline()). Such a failure is retried; any other is
# not.
CLIENT_SERVER_ATTEMPTS = 3
CLIENT_SERVER_FAILED = ("Ray client server failed", "ZombieProcess")


def _ray_init(ray: Any, remote: bool, **settings: Any) -> None:
    for attempt in range(1, CLIENT_SERVER_ATTEMPTS + 1):
        try:
            ray.init(**settings)
            return
        except (RuntimeError, ConnectionError) as exc:  # Ray Client: ConnectionAbortedError
            if (
                not remote
                or not any(sign in str(exc) for sign in CLIENT_SERVER_FAILED)
                or attempt == CLIENT_SERVER_ATTEMPTS
            ):
                raise
            print(
                f"aotc serve: the Ray head could not start a client server for this connection "
                f"(attempt {attempt} of {CLIENT_SERVER_ATTEMPTS}); connecting again",
                file=sys.stderr,
            )
            ray.shutdown()  # what the failed connection left behind, before the next one
            time.sleep(2)


@contextlib.contextmanager
def caller_sigterm_handler() -> Iterator[None]:
    """Keep the process's SIGTERM handler across ray.init: Ray's core installs one that ends the
    process on the spot with a native stack dump, where the CLI stops like Ctrl-C (taking the
    deployment down) and a library caller keeps whatever it had."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def ray_on_loopback(local: bool) -> Iterator[None]:
    """A local Ray's own ports (GCS, raylet, object manager, workers, agents, metrics) on 127.0.0.1
    instead of every interface: no other machine joins a local Ray. Only `--host` decides where
    the HTTP proxy listens. Ray reads its flag in this process from ray_constants (set when ray
    was imported) and in the processes ray.init starts from the environment: both are set for the
    call and put back after it. Ray Serve's replicas still open one gRPC port each on every
    interface (hard-coded `[::]:0` in Ray 2.60)."""
    if not local:
        yield
        return
    from ray._private import ray_constants

    # Ray 2.60 warns at every local start that it enabled token authentication (its default when
    # RAY_AUTH_MODE is unset), though such a Ray listens on loopback only; aotc serve says nothing
    # of it (auth stays on)
    logging.getLogger(RAY_AUTH_LOGGER).addFilter(_without_auth_notice)
    saved = os.environ.get(RAY_CLUSTER_FLAG), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[RAY_CLUSTER_FLAG] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop(RAY_CLUSTER_FLAG, None)
        else:
            os.environ[RAY_CLUSTER_FLAG] = saved[0]
        ray_constants.ENABLE_RAY_CLUSTER = saved[1]


RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def _without_auth_notice(record: logging.LogRecord) -> bool:
    return "Token authentication is enabled for this Ray cluster" not in record.getMessage()


def reachable_host(options: ServeOptions) -> str:
    """Where this process reaches the HTTP proxy: the cluster's head for ray://HEAD:PORT (a proxy
    runs on every node), else this machine."""
    from urllib.parse import urlsplit

    if options.address and options.address.startswith("ray://"):
        return urlsplit(options.address).hostname or "127.0.0.1"
    if options.address and ":" in options.address and "//" not in options.address:
        return options.address.rsplit(":", 1)[0]  # head:6379, from a node of the cluster
    return options.host if options.host not in ("0.0.0.0", "::") else "127.0.0.1"


def wait_until_answering(server: Server) -> dict:
    """Poll /v1/health until a replica answers, then every route the package serves until each
    answers as aotc does: until the application is deployed, Ray's proxy already listens and
    answers 404 "Path '/v1/completions' not found", so `aotc serve` says it is ready only after
    this. A refusal comes back as the replicas' reason."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last = "no answer yet"
    health: dict | None = None
    while time.monotonic() < deadline:
        try:
            if health is None:
                status, state = _ask(server.url, "GET /v1/health")
                if state is not None and state.get("status") == "refused":
                    return {**state, "reason": refusal_reason(server)}
                if status == 200 and state is not None:
                    health = state
                else:
                    status_text = (state or {}).get("status", "not aotc's answer yet")
                    last = f"/v1/health: HTTP {status}: {status_text}"
            if health is not None:
                waiting = [
                    endpoint
                    for endpoint in server.metadata["endpoints"]
                    if _ask(server.url, endpoint)[1] is None
                ]
                if not waiting:
                    return health
                last = f"{waiting[0]} does not answer yet"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)  # a replica answers within seconds: each poll is a cheap GET
    raise ServeError(
        f"the server at {server.url} did not answer within {START_TIMEOUT_S:.0f} s ({last}); "
        f"see {REPLICA_LOGS}"
    )


def _ask(url: str, endpoint: str) -> tuple[int, dict | None]:
    """(status, JSON body) of `endpoint` ("GET /v1/models"; a POST sends `{}`, which every aotc
    route refuses in JSON without running a model); the body is None when it is not a JSON
    object, as Ray's proxy's 404 for a route not deployed yet is not."""
    import json
    import urllib.error
    import urllib.request

    method, path = endpoint.split(" ", 1)
    request = urllib.request.Request(
        url + path, data=b"{}" if method == "POST" else None, method=method,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=15) as reply:
            status, data = reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        status, data = exc.code, exc.read()
    try:
        body = json.loads(data)
    except ValueError:
        return status, None
    return status, body if isinstance(body, dict) else None


def refusal_reason(server: Server) -> str:
    """Why a replica refused the package, asked of it through Ray: /v1/health does not say (the
    reason names paths and machines)."""
    from ray import serve

    name = COMPLETIONS_DEPLOYMENT if "generation" in server.metadata else MODEL_DEPLOYMENT
    try:
        handle = serve.get_deployment_handle(name, app_name=APP_NAME)
        reason = handle.refusal.remote().result(timeout_s=REFUSAL_TIMEOUT_S)
    except Exception as exc:  # Ray's errors here have no common base; the log still has it
        logger.warning("could not ask the replica why it refused the package: %r", exc)
        reason = None
    return reason or f"a replica refused the package; {REPLICA_LOGS} say why"


def stop(server: Server) -> None:
    """Remove the deployment (and the package store), take the request log's last lines; stop
    Ray if this process started it.

    Only the application is deleted, on a local Ray too (its replicas finish what they answer):
    `serve.shutdown()` ends with Serve's controller killing itself under its own graceful_shutdown
    call, which Ray 2.60 reports on the terminal as "Task ServeController.graceful_shutdown
    failed ... killed by `ray.kill`". ray.shutdown() then stops the controller and the proxy
    with the rest of the local Ray."""
    import ray
    from ray import serve

    try:
        _delete_application(serve)  # on a cluster, other applications of its Serve stay
        if server.store is not None:
            ray.kill(server.store)
    finally:
        try:
            if server.request_log is not None:  # after the replicas: their last lines too
                server.request_log.stop()
        finally:
            if server.started_ray:
                _shutdown_ray(server.print_before_ray)


def _delete_application(serve: Any, timeout_s: float = 60.0) -> None:
    """serve.delete, then wait until the application is gone, asking every 50 ms. serve.delete's
    own wait asks once a second, so each stop idled up to a second after its replicas had ended.
    A timeout raises as serve.delete's would."""
    from ray.serve.schema import ApplicationStatus

    serve.delete(APP_NAME, _blocking=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        application = serve.status().applications.get(APP_NAME)
        if application is None or application.status == ApplicationStatus.NOT_STARTED:
            return
        time.sleep(0.05)
    raise TimeoutError(f"Ray Serve did not delete {APP_NAME} within {timeout_s:.0f} s")


def _shutdown_ray(print_before_ray: Any) -> None:
    """ray.shutdown(), and the process's own print() back (Ray may have put its own in place)."""
    import ray

    ray.shutdown()
    if print_before_ray is not None:
        builtins.print = print_before_ray


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children first, then theirs), read from /proc: the local
    Ray's node processes are this process's children, its workers and agents their children."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def kill_everything_started() -> None:
    """SIGKILL every process this one started, Ray's included: what a stop that hangs falls back to
    (Ray's agents do not share the fate of the process that started Ray, and would stay)."""
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
