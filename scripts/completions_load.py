"""A bounded load client for `aotc serve`'s /v1/completions: N concurrent streams, each sending a
fixed number of streamed requests one after another, over loopback.

Reports, per concurrency: aggregate tokens/s (all tokens / wall time), per-stream tokens/s (a
stream's tokens / its own busy time, median over streams), time to first token p50/p99 (request
sent -> first token event), inter-token latency p50/p99 (between a request's token events), and,
with --baseline, `aotc generate`'s own decode tokens/s in this process for the same request (the
HTTP and Ray overhead at 1 stream is the ratio of the two).

usage: python scripts/completions_load.py http://127.0.0.1:8000 --streams 1,8,32 --requests 4
       [--prompt-ids 5,17,42] [--max-tokens 64] [--temperature 0|default|T] [--baseline PKG]
       [--out docs/bench/serve_load.json]
Start the server first (`aotc serve PKG --port 8000`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from urllib.parse import urlsplit


def percentile(values: list, q: float) -> float:
    """The runtime's nearest-rank percentile (aotc_runtime.timing), as `aotc generate` and `aotc
    bench` report theirs: one definition."""
    from aotc_runtime.timing import percentile as nearest_rank

    return nearest_rank(sorted(values), q / 100) if values else float("nan")


def one_request(url: str, body: dict, timeout: float) -> tuple[float, list]:
    """(seconds to the first token, arrival time of every token event) of one streamed request."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    sent = time.perf_counter()
    connection.request(
        "POST", "/v1/completions", json.dumps({**body, "stream": True}).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read()[:200]!r}")
    arrivals = []
    buffer = b""
    while True:
        chunk = response.read1(65536)
        if not chunk:
            break
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if event == b"data: [DONE]":
                connection.close()
                return arrivals[0] - sent, arrivals
            data = json.loads(event[len(b"data: ") :])
            if "choices" not in data:  # the server's error event: its message is the failure
                raise RuntimeError(f"error event: {event[:300]!r}")
            arrivals.extend([time.perf_counter()] * len(data["choices"][0]["token_ids"]))
    connection.close()
    raise RuntimeError("the stream ended without [DONE]")


def run(url: str, streams: int, requests: int, body: dict, timeout: float) -> dict:
    ttft, gaps, tokens, stream_rates, failures = [], [], [0], [], []
    lock = threading.Lock()

    def stream() -> None:
        began, made = time.perf_counter(), 0
        for _ in range(requests):
            try:
                first, arrivals = one_request(url, body, timeout)
            except Exception as exc:  # counted and reported, the load goes on
                with lock:
                    failures.append(str(exc)[:200])
                continue
            made += len(arrivals)
            with lock:
                ttft.append(first)
                gaps.extend(b - a for a, b in zip(arrivals, arrivals[1:]))
                tokens[0] += len(arrivals)
        with lock:
            stream_rates.append(made / (time.perf_counter() - began))

    threads = [threading.Thread(target=stream) for _ in range(streams)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    return {
        "streams": streams,
        "requests": streams * requests,
        "failed": len(failures),
        "failures": failures[:3],
        "aggregate_tokens_per_s": round(tokens[0] / wall, 1),
        "per_stream_tokens_per_s": round(statistics.median(stream_rates), 1),
        "ttft_ms": {
            "p50": round(percentile(ttft, 50) * 1e3, 2),
            "p99": round(percentile(ttft, 99) * 1e3, 2),
        },
        "inter_token_ms": {
            "p50": round(percentile(gaps, 50) * 1e3, 3),
            "p99": round(percentile(gaps, 99) * 1e3, 3),
        },
    }


def baseline(package: str, prompt: list, max_tokens: int, rounds: int = 5) -> dict:
    """`aotc generate`'s loop (Package.stream) on the same request, in this process."""
    import torch

    import aotc_runtime

    loaded = aotc_runtime.load(package)
    ids = torch.tensor([prompt])
    rates = []
    for _ in range(rounds + 1):
        stamps = [time.perf_counter()]
        for _tokens in loaded.stream(ids, max_new_tokens=max_tokens, eos_token_ids=[]):
            stamps.append(time.perf_counter())
        rates.append((len(stamps) - 2) / (stamps[-1] - stamps[1]))
    return {"decode_tokens_per_s": round(statistics.median(rates[1:]), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--streams", default="1,8,32")
    parser.add_argument("--requests", type=int, default=4, help="streamed requests per stream")
    parser.add_argument("--prompt-ids", default="5,17,42")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--temperature",
        default="0",
        help="0: greedy (default); default: left out, OpenAI's 1.0 (sampled); or a value",
    )
    parser.add_argument("--baseline", help="the served package: aotc generate's rate beside")
    parser.add_argument("--out")
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",")]
    # greedy by default, and then no end-of-sequence cut: every request makes max_tokens tokens
    body: dict = {"prompt": prompt, "max_tokens": args.max_tokens}
    if args.temperature != "default":
        body["temperature"] = float(args.temperature)
    report: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "url": args.url,
        "cpus": os.cpu_count(),
        "request": body,
        "runs": [],
    }
    run(args.url, 1, 1, body, args.timeout)  # warm-up: the first request loads what it needs
    for streams in (int(s) for s in args.streams.split(",")):
        result = run(args.url, streams, args.requests, body, args.timeout)
        result["load_average_1m"] = round(os.getloadavg()[0], 2)
        print(json.dumps(result), flush=True)
        report["runs"].append(result)
    if args.baseline:
        report["aotc_generate"] = baseline(args.baseline, prompt, args.max_tokens)
        print(json.dumps(report["aotc_generate"]))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
