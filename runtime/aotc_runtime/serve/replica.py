"""The model replica of `aotc serve`: one loaded package behind Ray Serve, with dynamic batching.

Requests arrive already checked against the signature (runtime/aotc_runtime/serve/ingress.py). With
a batch dim, Ray Serve's `@serve.batch` queues them and hands over as many as fit in
`max_batch_size` rows; they are joined into one call and the outputs split back. The wait adapts to
load: a request that finds the model idle runs at once; one that arrives while a call runs waits up
to `batch_wait_ms` for others to share the next call. The package runs
in one worker thread, so the event loop keeps collecting the next batch while a call runs.

A replica that cannot load the package (another torch, GPU or platform, damaged files, a signature
that does not hold under `--require-signature`) stays up and refuses: the reason is logged and given
to `aotc serve` (`refusal()`, through Ray), and /v1/health and every request answer 503 without it
(the reason names the package's path and this machine, which are the operator's business, not a
client's). Failing its constructor would make Ray retry it in a loop and then give up with the
reason buried in the logs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.serve import metrics

from aotc_runtime.serve.batching import batch_dim, batch_limit, groups, join, rows, split
from aotc_runtime.serve.shipping import PackageSource, load_package, release_when_read

logger = logging.getLogger("ray.serve")

# Buckets of the batch histograms: the sizes a package is usually specialized at, and powers of two.
ROW_BUCKETS: list[float] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


# what a client hears from a replica that refused the package; the reason is in the server's log
REFUSED = "this server's replicas could not load its package; the server's log says why"


class ReplicaRefusedError(Exception):
    """The replica could not load the package (the ingress answers 503 with REFUSED)."""


@dataclass(frozen=True)
class ReplicaSettings:
    max_batch_size: int = 16  # rows per call; 1 turns batching off
    batch_wait_s: float = 0.005  # while the model is busy, how long a batch waits for more requests
    threads: int = 1  # intra-op threads of the calling thread (CPU packages)
    public_key_pem: bytes | None = (
        None  # `--require-signature`: the key the package must be signed by
    )
    # text generation: a joining prompt starts from what a row of the KV cache holds
    # (aotc_runtime/prefix_cache.py); `--no-prefix-cache` turns it off
    prefix_cache: bool = True
    # the actor `aotc serve` takes the requests' lines from
    # (runtime/aotc_runtime/serve/request_log.py); None: `--no-request-log`
    request_log: str | None = None


def _request_rows(items: list) -> int:
    """serve.batch counts rows, not requests: a request of 4 rows takes 4 of the batch's places."""
    return sum(rows(tensors) for tensors in items)


def refusal_reason(exc: Exception) -> str:
    """The one line `aotc serve` prints for a replica that could not load the package."""
    where = f"the replica on {socket.gethostname()} (pid {os.getpid()})"
    return f"{where} refused the package: {' '.join(str(exc).split())}"


class ModelReplica:
    def __init__(self, source: PackageSource, settings: ReplicaSettings):
        import torch

        self._source = source
        self._folder = None
        self.package: Any = None
        self.refused: str | None = None
        self._id = uuid.uuid4().hex[
            :12
        ]  # tells replicas apart on /v1/health, and says nothing else
        # One thread calls the package (CUDA graphs and stateful packages run one call at a time
        # anyway); its intra-op threads are set in that thread, where they apply.
        self._executor = ThreadPoolExecutor(
            max_workers=1, initializer=torch.set_num_threads, initargs=(settings.threads,)
        )
        try:
            self._folder = source.materialize()
            self.package = load_package(self._folder, settings.public_key_pem)
        except Exception as exc:  # every reason a package cannot load here is reported, not raised
            self.refused = refusal_reason(exc)
            logger.error(self.refused)
        else:
            logger.info(
                "replica %s (pid %d on %s) serves %s", self._id, os.getpid(), socket.gethostname(),
                self._folder,
            )  # fmt: skip
        finally:
            release_when_read(source, self._folder)
        self.dim = None
        self.limit = 1
        if self.package is not None and settings.max_batch_size > 1:
            self.dim = batch_dim(self.package.signature)
            if self.dim is not None:
                self.limit = batch_limit(self.package.signature, self.dim, settings.max_batch_size)
        # serve.batch's wrapper carries its queue's setters, which Ray's types leave out
        self._batched.set_max_batch_size(self.limit)  # type: ignore[attr-defined]
        self._wait_s = settings.batch_wait_s
        self._busy = 0  # package calls running or waiting for the model thread
        self._rows = metrics.Histogram(
            "aotc_batch_rows",
            description="Rows per model call after dynamic batching (the batch size the package ran).",
            boundaries=ROW_BUCKETS,
        )
        # what /v1/health reports of this replica: calls against requests shows batching at work
        self.counts = {"requests": 0, "calls": 0, "rows": 0}
        self._requests = metrics.Histogram(
            "aotc_batch_requests",
            description="Requests joined into one model call.",
            boundaries=ROW_BUCKETS,
        )

    async def predict(self, tensors: list) -> dict:
        """One checked request's outputs (CPU tensors, the signature's order), with where its time
        went: `queued_ms` waiting for its batch and for the model thread, `call_ms` the package
        call it shared with `batch_rows` rows."""
        if self.refused is not None:
            raise ReplicaRefusedError(REFUSED)
        start = time.perf_counter()
        if self.dim is None or rows(tensors) > self.limit:
            outputs, call_s, batch = await self._call(tensors, requests=1)
        else:
            # An idle model runs a request at once: waiting for company would only add latency.
            # While a call runs, the next batch waits up to batch_wait_s and fills meanwhile.
            # (set through serve.batch's wrapper, whose setters Ray's types leave out)
            self._batched.set_batch_wait_timeout_s(self._wait_s if self._busy else 0.0)  # type: ignore[attr-defined]
            outputs, call_s, batch = await self._batched(tensors)
        total = time.perf_counter() - start
        return {
            "outputs": outputs,
            "queued_ms": (total - call_s) * 1000,
            "call_ms": call_s * 1000,
            "batch_rows": batch,
        }

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005, batch_size_fn=_request_rows)
    async def _batched(self, requests: list) -> list:
        answers: list = [None] * len(requests)
        for indexes in groups(requests):
            chunk = [requests[i] for i in indexes]
            sizes = [rows(tensors) for tensors in chunk]
            outputs, call_s, batch = await self._call(join(chunk), requests=len(chunk))
            for index, part in zip(indexes, split(outputs, sizes)):
                answers[index] = (part, call_s, batch)
        return answers

    async def _call(self, tensors: list, requests: int) -> tuple:
        """(outputs, seconds the package call took, rows it ran)."""
        loop = asyncio.get_running_loop()
        self._busy += 1
        try:
            outputs, seconds = await loop.run_in_executor(self._executor, self._run, tensors)
        finally:
            self._busy -= 1
        batch = rows(tensors) if tensors and tensors[0].dim() else 1
        self._rows.observe(batch)
        self._requests.observe(requests)
        self.counts["requests"] += requests
        self.counts["calls"] += 1
        self.counts["rows"] += batch
        return outputs, seconds, batch

    def _run(self, tensors: list) -> tuple:
        from aotc_runtime import flatten_outputs

        start = time.perf_counter()
        outputs = [t.detach().cpu() for t in flatten_outputs(self.package(*tensors))]
        return outputs, time.perf_counter() - start

    def health(self) -> dict:
        """What /v1/health tells anyone who asks: ready or not, and how batching goes."""
        return {
            "status": "refused" if self.refused else "ok",
            "replica": self._id,
            "shipped": self._source.store_name is not None,
            "batch_dim": self.dim,
            "max_batch_rows": self.limit,
            **self.counts,
        }

    def refusal(self) -> str | None:
        """Why this replica refused the package (None: it did not): for `aotc serve`, via Ray."""
        return self.refused
