"""`aotc serve` and `aotc-serve`: a package behind HTTP on Ray Serve, with dynamic batching.

One click command for both: aotc's CLI registers it in its group (`aotc serve`); a serving machine
with only `aotc-runtime[serve]` runs it as `aotc-serve` (or `python -m aotc_runtime.serve`), whose
errors end as aotc-run's do (aotc_runtime/exits.py): one line and the documented exit code.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from aotc_runtime.serve.cli_options import (
    ThreadsType,
    exit_codes_epilog,
    required_key,
    signature_options,
)

if TYPE_CHECKING:
    from aotc_runtime.serve.app import Server


@click.command(
    epilog=exit_codes_epilog(),
    # aotc's group's settings, so `aotc-serve --help` reads as `aotc serve --help` does
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.argument("package", type=click.Path(path_type=Path))
@click.option(
    "--host",
    help="Address to listen on. Default: 127.0.0.1 on a local Ray; 0.0.0.0 with --address (the "
    "proxies on the cluster's nodes must be reachable from other machines).",
)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Model replicas (each loads the package); Ray places them on the cluster's machines.",
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(min=1),
    help="Most rows one model call takes after dynamic batching; 1 turns batching off. "
    "Default: the package's largest specialized size, else 16 (within the package's range).",
)
@click.option(
    "--batch-wait-ms",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="While a call runs, how long the next batch waits for more requests (a request that "
    "finds the model idle runs at once).",
)
@click.option(
    "--address",
    help="A Ray cluster to deploy on (ray://head:10001, or auto); default: Ray on this machine.",
)
@click.option(
    "--gpus-per-replica",
    type=click.FloatRange(min=0),
    help="GPUs each replica reserves (0.5: two share one). Default: 1 for a CUDA package, else 0.",
)
@click.option(
    "--threads",
    type=ThreadsType(),  # a bad value: one line, exit 2, as aotc generate and aotc bench say it
    help="Intra-op threads per replica (CPU packages; 1 to 1024). Default: the physical cores "
    "this process may use / replicas (one fewer for a text-generation package: a core for the "
    "HTTP side).",
)
@click.option(
    "--max-body-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=64.0,
    show_default=True,
    help="Largest request body; larger ones get HTTP 413. A completion's body is also held to what "
    "the package's longest prompt needs (16 KiB + 64 B per --max-seq-len token).",
)
@click.option(
    "--max-answer-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=32.0,
    show_default=True,
    help="Largest answer one completion request may make, whole or streamed (n answers, their "
    "logprobs); past it a whole answer gets HTTP 400 and a stream ends with that error, and the "
    "request's rows are freed.",
)
@click.option(
    "--body-timeout-s",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="A request's body must arrive within this many seconds of its headers, or it gets HTTP "
    "408 and its connection is closed.",
)
@click.option(
    "--ship/--no-ship",
    default=None,
    help="Send the package to the replicas through Ray instead of letting them read PACKAGE "
    "(default: ship exactly when --address is given).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="Local Ray: serve Prometheus metrics (Ray Serve's and aotc's batch sizes) on this port "
    "at /metrics. On a cluster, Ray's own metrics port applies.",
)
@click.option(
    "--prefix-cache/--no-prefix-cache",
    default=True,
    show_default=True,
    help="Text generation: a request whose prompt starts as a row of the KV cache already holds "
    "(a chat's earlier turns, a shared system prompt) is fed only the rest; usage reports them as "
    "prompt_tokens_details.cached_tokens.",
)
@click.option(
    "--request-log/--no-request-log",
    default=True,
    show_default=True,
    help="One line per request on stderr, as each ends (a stream when it ends): endpoint, "
    "status, the usage's prompt, cached and completion tokens, time to first token, tokens/s and "
    "total time; a refusal's code and param (logger aotc.serve.requests).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Start, send one request of random inputs, print the answer, stop (for CI).",
)
@signature_options
def serve(
    package: Path,
    host: str | None,
    port: int,
    replicas: int,
    max_batch_size: int | None,
    batch_wait_ms: float,
    address: str | None,
    gpus_per_replica: float | None,
    threads: int | None,
    max_body_mb: float,
    max_answer_mb: float,
    body_timeout_s: float,
    ship: bool | None,
    metrics_port: int | None,
    prefix_cache: bool,
    request_log: bool,
    check: bool,
    require_signature: bool,
    public_key: Path | None,
) -> None:
    """Serve PACKAGE over HTTP. The routes, by the kind of package:

    \b
      a model package:            POST /v1/predict
      a text-generation package:  POST /v1/completions, POST /v1/chat/completions
                                  (with its chat template), GET /v1/models
      both:                       GET /v1/health, GET /v1/metadata

    It says it is ready only once every route answers. OpenAI's request fields, answers and
    errors: docs/usage.md (aotc serve).

    Errors are JSON in OpenAI's shape: {"error": {"message": "<one line>", "type":
    "invalid_request_error" or "server_error", "param": <field or null>, "code": <null or a short
    string>}}. With --require-signature, the package is checked here and again by each replica as
    it loads it.

    \b
    Examples:
      aotc serve model_pkg --replicas 2
      aotc serve lm_pkg --require-signature --public-key KEY.pub.pem
    """
    public_key = required_key(require_signature, public_key)
    require_ray_serve()
    from aotc_runtime.serve.app import ServeOptions, start

    options = ServeOptions(
        package=package,
        host=host or ("0.0.0.0" if address else "127.0.0.1"),
        port=port,
        replicas=replicas,
        max_batch_size=max_batch_size,
        batch_wait_ms=batch_wait_ms,
        address=address,
        gpus_per_replica=gpus_per_replica,
        threads=threads,
        max_body_bytes=int(max_body_mb * (1 << 20)),
        body_timeout_s=body_timeout_s,
        max_answer_bytes=int(max_answer_mb * (1 << 20)),
        ship=ship,
        metrics_port=metrics_port,
        public_key=public_key,
        prefix_cache=prefix_cache,
        request_log=request_log,
    )
    click.echo(f"starting Ray Serve for {package} ...", err=True)
    with request_lines_on_stderr(request_log):
        serve_until_stopped(start(options), check)


INSTALL = "pip install 'aotc-runtime[serve]'"  # aotc[serve] installs the same


def require_ray_serve() -> None:
    """Ray Serve is the `serve` extra's: missing, it is the machine's setup (exit 2), not a bug."""
    try:
        import ray.serve  # noqa: F401
    except ImportError as exc:
        from aotc_runtime.errors import MissingDependencyError

        # exc.name: the module not found, ray's own or one of its imports
        if exc.name is None or exc.name in ("ray", "ray.serve"):
            raise MissingDependencyError(
                f"aotc serve needs ray.serve, which is not installed; {INSTALL} (or 'aotc[serve]' "
                "beside the compiler)"
            ) from None
        raise MissingDependencyError(
            f"aotc serve needs ray.serve, which is installed but fails to import ({exc}); "
            f"reinstall it: {INSTALL} --force-reinstall"
        ) from None


def main(argv: list[str] | None = None) -> int:
    """`aotc-serve` (console script) and `python -m aotc_runtime.serve`: the command alone."""
    from aotc_runtime.exits import exit_code_of, terminate_like_interrupt

    def invoke() -> int | None:
        try:
            # standalone_mode=False: click returns --help's and --check's codes, raises the rest
            return serve.main(argv, prog_name="aotc-serve", standalone_mode=False)
        except click.ClickException as exc:  # a usage error: click's message, exit 2
            exc.show()
            return exc.exit_code
        except click.exceptions.Abort:  # click's form of Ctrl-C
            raise KeyboardInterrupt from None

    terminate_like_interrupt()
    return exit_code_of(invoke)


def serve_until_stopped(server: Server, check: bool) -> None:
    """Say where it serves, then serve until Ctrl-C or SIGTERM (--check: one request), and stop."""
    import os
    import socket

    from aotc_runtime.serve.app import stop

    options = server.options
    package, address, metrics_port = options.package, options.address, options.metrics_port
    try:
        refused = server.health.get("status") == "refused"
        if refused:
            from aotc_runtime import PackageError

            raise PackageError(server.health.get("reason") or "a replica refused the package")
        batching = server.metadata["batching"]
        generation = server.metadata.get("generation")
        if generation is not None:
            routes = [e for e in server.metadata["endpoints"] if "/v1/health" not in e
                      and "/v1/metadata" not in e]  # fmt: skip
            click.echo(
                f"serving {package} at {server.url} as model '{generation['model']}': "
                f"{', '.join(routes)}; {options.replicas} replica(s), up to "
                f"{generation['batch_size']} requests generating at once (continuous batching)",
                err=True,
            )
        else:
            click.echo(
                f"serving {package} at {server.url}/v1/predict: {options.replicas} replica(s), "
                + (
                    f"batches of up to {batching['max_rows']} rows along {batching['dim']} "
                    f"(wait {options.batch_wait_ms:g} ms)"
                    if batching["dim"]
                    else "no batching (one request per call)"
                ),
                err=True,
            )
        # where it runs is for the operator, here, and not on /v1/health for any caller
        click.echo(f"package {package.resolve()}; aotc serve is pid {os.getpid()} on "
                   f"{socket.gethostname()}", err=True)  # fmt: skip
        if metrics_port and not address:
            click.echo(f"metrics at http://127.0.0.1:{metrics_port}/metrics", err=True)
        if check:
            raise click.exceptions.Exit(check_once(server))
        try:
            # inside the try: a SIGTERM sent as soon as this line is read may land while it prints
            click.echo("Ctrl-C stops it", err=True)
            _wait_forever()
        except KeyboardInterrupt:  # the way a server is stopped: not an error
            click.echo("stopping", err=True)
            end_after(STOP_TIMEOUT_S)
    finally:
        stop(server)


@contextlib.contextmanager
def request_lines_on_stderr(enabled: bool) -> Iterator[None]:
    """The request log's lines (runtime/aotc_runtime/serve/request_log.py) on stderr, each after its
    time, while the server runs (`--no-request-log`: none)."""
    if not enabled:
        yield
        return
    import logging
    import sys

    from aotc_runtime.serve.request_log import LOGGER_NAME

    log = logging.getLogger(LOGGER_NAME)
    handler = logging.StreamHandler(sys.stderr)  # this command's stderr (CliRunner swaps it)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    saved = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # once, here: not again through a handler of the root logger's
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


def check_once(server: Server) -> int:
    """One request of seeded random inputs at the example sizes (a text-generation package: a
    4-token completion of token 1); prints the answer; 0 if it was 200."""
    from aotc_runtime import Signature
    from aotc_runtime.serve.client import Client
    from aotc_runtime.serve.protocol import JSON_TYPE

    if "generation" in server.metadata:
        client = Client(server.url)
        body = {"prompt": [1], "max_tokens": 4, "temperature": 0}
        reply = client.request("POST", "/v1/completions", json.dumps(body).encode(), JSON_TYPE)
        client.close()
        if reply.status != 200:
            click.echo(
                f"error: POST /v1/completions answered {reply.status}: {reply.body[:300]!r}",
                err=True,
            )
            return 9
        click.echo(f"POST /v1/completions -> 200 in {reply.seconds * 1000:.1f} ms")
        click.echo(json.dumps(reply.json())[:2000])
        return 0

    signature = Signature.from_json(server.metadata["signature"])
    inputs = dict(zip(signature.input_names, signature.random_inputs(seed=0)))
    client = Client(server.url)
    reply = client.predict(inputs)
    client.close()
    if reply.status != 200:
        click.echo(
            f"error: POST /v1/predict answered {reply.status}: {reply.body[:300]!r}", err=True
        )
        return 9
    shapes = {name: list(value.shape) for name, value in reply.outputs().items()}
    click.echo(f"POST /v1/predict -> 200 in {reply.seconds * 1000:.1f} ms; outputs {shapes}")
    click.echo(json.dumps(reply.json())[:2000])
    return 0


# A stop takes 10 s on the 2-core VM; Ray's own shutdown can hang on rare occasions (seen once in
# CI: a SIGTERM'd server still up 120 s later; ray-project/ray#29431, #44836 are of that kind).
STOP_TIMEOUT_S = 60.0


def end_after(seconds: float) -> None:
    """Ends the process `seconds` from now if it has not ended by then, with every process it
    started: a server asked to stop stops. A daemon thread, so it still runs while atexit handlers
    (Ray's shutdown among them) run."""
    import os
    import threading
    import time

    from aotc_runtime.serve.app import kill_everything_started

    def watchdog() -> None:
        time.sleep(seconds)
        click.echo(
            f"warning: Ray did not stop within {seconds:.0f} s; ending it and every process it "
            "started",
            err=True,
        )
        kill_everything_started()
        os._exit(0)

    threading.Thread(target=watchdog, name="aotc-stop-watchdog", daemon=True).start()


def _wait_forever() -> None:
    import time

    while True:  # Ctrl-C or SIGTERM ends it (KeyboardInterrupt), and `finally` takes it down
        time.sleep(3600)
