"""What the prefix cache saves through `aotc serve` (HTTP, streamed completions over loopback), in
two workloads, each run against the server as it is started (`--prefix-cache` or
`--no-prefix-cache`: run the script once against each):

- conversation: a first turn of --first tokens (random ids, its own per round), then a second turn
  that is the first, its reply and --more new tokens; each turn's time to its first token, median
  over --rounds rounds, and the second's over the first's;
- shared: --streams clients at once, each sending --requests requests one after another, every
  prompt a --shared-tokens start common to all and --suffix tokens of its own; the tokens of every
  answer over the wall time, and the median time to first token.

usage: python scripts/prefix_cache_bench.py http://127.0.0.1:8000 --label on
       [--first 1450 --more 50 --rounds 3] [--shared-tokens 1000 --suffix 16 --streams 32
       --requests 2] [--max-tokens 16] [--vocab 49152] [--out OUT.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlsplit


def completion(url: str, prompt: list, max_tokens: int, timeout: float = 1800.0) -> dict:
    """One streamed greedy completion: {"ttft_s", "ids", "cached"} (cached from the usage)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}  # fmt: skip
    sent = time.perf_counter()
    connection.request("POST", "/v1/completions", json.dumps(body).encode())
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read()[:300]!r}")
    first, ids, cached, buffer = None, [], None, b""
    while True:
        chunk = response.read1(65536)
        if not chunk:
            break
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            data = event[len(b"data: ") :]
            if data == b"[DONE]":
                connection.close()
                return {"ttft_s": first, "ids": ids, "cached": cached}
            answer = json.loads(data)
            if answer.get("usage"):
                cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            for choice in answer["choices"]:
                if first is None:
                    first = time.perf_counter() - sent
                ids += choice["token_ids"]
    raise RuntimeError("the stream ended before [DONE]")


def conversation(args, draw: random.Random) -> dict:
    firsts, seconds, cached = [], [], []
    for _ in range(args.rounds):
        prompt = [draw.randrange(3, args.vocab) for _ in range(args.first)]
        one = completion(args.url, prompt, args.max_tokens)
        turn = prompt + one["ids"] + [draw.randrange(3, args.vocab) for _ in range(args.more)]
        two = completion(args.url, turn, args.max_tokens)
        firsts.append(one["ttft_s"])
        seconds.append(two["ttft_s"])
        cached.append(two["cached"])
    first, second = statistics.median(firsts), statistics.median(seconds)
    return {"first_turn_ttft_s": round(first, 4), "second_turn_ttft_s": round(second, 4),
            "second_over_first": round(second / first, 4), "second_turn_cached_tokens": cached,
            "first_turn_tokens": args.first, "second_turn_tokens": args.first + args.max_tokens
            + args.more}  # fmt: skip


def shared(args, draw: random.Random) -> dict:
    start = [draw.randrange(3, args.vocab) for _ in range(args.shared_tokens)]
    suffixes = [
        [[draw.randrange(3, args.vocab) for _ in range(args.suffix)] for _ in range(args.requests)]
        for _ in range(args.streams)
    ]
    results: list = []
    lock = threading.Lock()

    def client(mine: list) -> None:
        for suffix in mine:
            done = completion(args.url, start + suffix, args.max_tokens)
            with lock:
                results.append(done)

    threads = [threading.Thread(target=client, args=(mine,)) for mine in suffixes]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    tokens = sum(len(done["ids"]) for done in results)
    return {"streams": args.streams, "requests": len(results), "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 2),
            "ttft_p50_s": round(statistics.median(d["ttft_s"] for d in results), 3),
            "cached_tokens": sum(d["cached"] or 0 for d in results)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--label", default="", help="what the server runs (on, off)")
    parser.add_argument("--first", type=int, default=1450)
    parser.add_argument("--more", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shared-tokens", type=int, default=1000)
    parser.add_argument("--suffix", type=int, default=16)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--skip", choices=["conversation", "shared"])
    parser.add_argument("--out")
    args = parser.parse_args()
    record: dict = {"label": args.label, "date": time.strftime("%Y-%m-%d")}
    if args.skip != "conversation":
        record["conversation"] = conversation(args, random.Random(1))
        print(json.dumps(record["conversation"]), flush=True)
    if args.skip != "shared":
        record["shared"] = shared(args, random.Random(2))
        print(json.dumps(record["shared"]), flush=True)
    if args.out:
        with open(args.out, "a") as out:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
