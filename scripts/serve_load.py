#!/usr/bin/env python3
"""Load benchmark of `aotc serve`: throughput and latency percentiles at fixed client concurrency,
for each number of replicas and each batching setting, side by side in one run.

    python scripts/serve_load.py PKG --replicas 1,2 --max-batch 1,16 --concurrency 1,8,32 \
        --seconds 30 --json out.json

For each (replicas, max batch) the server is started on a local Ray, warmed with a few requests,
then each concurrency level runs for --seconds: that many client threads (one kept-alive
connection each) send requests back to back, each of --rows rows of seeded random inputs, as
.npz (--json-body: JSON). Bounded: every request has a timeout and the loop ends at the deadline.
Reported: answered requests per second, rows per second, p50/p90/p99 latency, errors.
The client runs on the same machine as the server and takes CPU from it: on a small machine
that is part of what is measured (docs/benchmarks.md says so beside the figures).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def run_level(url: str, inputs: dict, concurrency: int, seconds: float, as_npz: bool) -> dict:
    from aotc_runtime.serve.client import Client

    latencies: list = []
    stages: dict = {}
    errors: list = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def worker():
        client = Client(url, timeout=60)
        mine, bad, timings = [], [], []
        while time.perf_counter() < deadline:
            try:
                reply = client.predict(inputs, as_npz=as_npz)
            except OSError as exc:
                bad.append(repr(exc))
                continue
            if reply.status == 200:
                mine.append(reply.seconds)
                timings.append(reply.timings())
            else:
                bad.append(reply.status)
        client.close()
        with lock:
            latencies.extend(mine)
            errors.extend(bad)
            for timing in timings:
                for name, ms in timing.items():
                    stages.setdefault(name, []).append(ms)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    rows = next(iter(inputs.values())).shape[0]
    return {
        "concurrency": concurrency,
        "seconds": round(elapsed, 2),
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "rows_per_s": round(len(latencies) * rows / elapsed, 1),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p90_ms": round(percentile(latencies, 90) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2) if latencies else None,
        "errors": len(errors),
        "first_errors": errors[:3],
        # medians of the server's own account (Server-Timing): what the client's latency is made of;
        # the rest of p50_ms is HTTP and Ray Serve's proxy
        "server_ms_p50": {name: round(statistics.median(v), 3) for name, v in stages.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--max-batch", default="1,16")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rows", type=int, default=1, help="rows per request")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--threads", type=int, help="intra-op threads per replica (CPU)")
    parser.add_argument("--gpus-per-replica", type=float)
    parser.add_argument("--json-body", action="store_true", help="send JSON instead of .npz")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)

    from aotc_runtime import Signature
    from aotc_runtime.serve.app import ServeOptions, start, stop
    from aotc_runtime.serve.client import Client

    results = []
    for replicas in map(int, args.replicas.split(",")):
        for max_batch in map(int, args.max_batch.split(",")):
            options = ServeOptions(
                package=args.package,
                port=free_port(),
                replicas=replicas,
                max_batch_size=max_batch,
                batch_wait_ms=args.batch_wait_ms,
                threads=args.threads,
                gpus_per_replica=args.gpus_per_replica,
            )
            server = start(options)
            try:
                signature = Signature.from_json(server.metadata["signature"])
                sizes = {server.metadata["batching"]["dim"] or "B": args.rows}
                tensors = signature.random_inputs(seed=0, sizes=sizes)
                inputs = dict(zip(signature.input_names, tensors))
                warm = Client(server.url)
                for _ in range(20 * replicas):  # every replica's first calls (CUDA graphs)
                    assert warm.predict(inputs).status == 200
                warm.close()
                for concurrency in map(int, args.concurrency.split(",")):
                    row = run_level(
                        server.url, inputs, concurrency, args.seconds, not args.json_body
                    )
                    row.update(replicas=replicas, max_batch=max_batch)
                    results.append(row)
                    print(
                        f"replicas {replicas} max batch {max_batch:>2} concurrency {concurrency:>3}: "
                        f"{row['requests_per_s']:>8.1f} req/s  p50 {row['p50_ms']:>7.2f} ms  "
                        f"p99 {row['p99_ms']:>7.2f} ms  errors {row['errors']}  server p50 ms "
                        + " ".join(f"{k} {v:.2f}" for k, v in row["server_ms_p50"].items()),
                        flush=True,
                    )
            finally:
                stop(server)
    if args.json:
        args.json.write_text(json.dumps({"package": str(args.package), "rows": args.rows,
                                         "results": results}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
