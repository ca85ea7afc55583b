"""Load on the decode engine in-process, as `aotc serve` drives it but without HTTP: closed-loop
streams of requests of mixed prompt lengths and max_tokens, each stream sending its next request
when the previous one ends, every request admitted in arrival order when a row is free
(runtime/aotc_runtime/serve/completion_engine.py's admission). Each stream count runs twice on the
same requests: all greedy, and all at OpenAI's default sampling (temperature 1.0, a seed of their
own).

Reports per run: aggregate tokens/s, and time to first token (arrival to first token) p50/p99,
for all requests and for those that arrived while every other stream was running (a request
joining a full running batch).

usage: python scripts/engine_load.py PACKAGE --streams 1,32 [--requests 8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

import aotc_runtime  # noqa: E402
from aotc_runtime.decode_engine import DecodeEngine  # noqa: E402
from aotc_runtime.generation_request import GenerationRequest  # noqa: E402
from aotc_runtime.sampling import GREEDY, Sampling  # noqa: E402
from aotc_runtime.timing import percentile  # noqa: E402


def requests_for(streams: int, per_stream: int, prompt: tuple, new: tuple, vocab: int, seed: int):
    """Each stream's requests: (prompt ids, max_tokens), the same for every sampling mode."""
    rng = random.Random(seed)
    return [
        [
            (
                [rng.randrange(vocab) for _ in range(rng.randint(*prompt))],
                rng.randint(*new),
            )
            for _ in range(per_stream)
        ]
        for _ in range(streams)
    ]


def run(
    package, plan: list, sampled: bool, prefill_chunk: int = 256, step_tokens: int = 2048
) -> dict:
    engine = DecodeEngine(package, prefill_chunk=prefill_chunk, step_tokens=step_tokens)
    streams = len(plan)
    pending: deque = deque()  # (stream, request index, arrival time, others running at arrival)
    live: dict = {}  # key -> [stream, index, arrival, first token time, tokens, full at arrival]
    next_index = [0] * streams
    draw = random.Random(1)

    def arrive(stream: int) -> None:
        index = next_index[stream]
        if index < len(plan[stream]):
            next_index[stream] += 1
            pending.append((stream, index, time.perf_counter(), len(live) + len(pending)))

    for stream in range(streams):
        arrive(stream)
    # the first arrivals came together: none joined a running batch
    pending = deque((s, i, t, 0) for s, i, t, _ in pending)
    done, tokens = [], 0
    step_ms: dict = {"join": [], "decode": []}  # a step that feeds a prompt chunk, or decodes only
    started = time.perf_counter()
    while pending or live:
        while pending:
            stream, index, arrived, others = pending[0]
            prompt, new = plan[stream][index]
            if not engine.has_free_row:
                break
            pending.popleft()
            sampling = Sampling(temperature=1.0, seed=draw.getrandbits(63)) if sampled else GREEDY
            key = (stream, index)
            engine.join(key, GenerationRequest(tuple(prompt), new, sampling, eos_token_ids=()))
            live[key] = [arrived, None, 0, others >= streams - 1 and streams > 1]
        joining = any(row is not None and row.prompt for row in engine.rows)
        before = time.perf_counter()
        made_now = engine.step()
        step_ms["join" if joining else "decode"].append((time.perf_counter() - before) * 1e3)
        for made in made_now:
            row = live[made.key]
            if row[1] is None:
                row[1] = time.perf_counter()
            row[2] += 1
            tokens += 1
            if made.finish is not None:
                done.append(live.pop(made.key))
                arrive(made.key[0])
    wall = time.perf_counter() - started
    first = sorted((r[1] - r[0]) * 1e3 for r in done)
    joined_full = sorted((r[1] - r[0]) * 1e3 for r in done if r[3])

    def spread(values: list) -> dict:
        if not values:
            return {}
        return {"n": len(values), "p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}

    return {
        "streams": streams,
        "sampling": "temperature 1.0" if sampled else "greedy",
        "requests": len(done),
        "tokens": tokens,
        "seconds": wall,
        "tokens_per_s": tokens / wall,
        "ttft_ms": spread(first),
        "ttft_joining_full_batch_ms": spread(joined_full),
        # host time of each kind of step (on CUDA a decode step returns the step queued before)
        "steps": {
            kind: {"n": len(ms), "total_s": sum(ms) / 1e3, **spread(sorted(ms))}
            for kind, ms in step_ms.items()
        },
        "prefill_chunk": prefill_chunk,
        "step_tokens": step_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--streams", default="1,32")
    parser.add_argument("--requests", type=int, default=8, help="requests per stream")
    parser.add_argument("--prompt", default="16-512", help="prompt lengths, LOW-HIGH tokens")
    parser.add_argument("--max-tokens", default="16-256", help="max_tokens, LOW-HIGH")
    parser.add_argument("--prefill-chunks", default="256", help="prompt tokens a step feeds a row")
    parser.add_argument(
        "--step-tokens", type=int, default=2048, help="prompt tokens a step feeds all rows"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    package = aotc_runtime.load(args.package)
    generation = package.generation
    prompt = tuple(int(v) for v in args.prompt.split("-"))
    new = tuple(int(v) for v in args.max_tokens.split("-"))
    warm = requests_for(2, 2, (8, 16), (4, 8), generation.vocab_size, 99)
    run(package, warm, sampled=False)  # graph captures and first calls out of the figures
    run(package, warm, sampled=True)
    results = []
    for chunk in (int(c) for c in args.prefill_chunks.split(",")):
        for streams in (int(s) for s in args.streams.split(",")):
            plan = requests_for(streams, args.requests, prompt, new, generation.vocab_size, streams)
            for sampled in (False, True):
                result = run(package, plan, sampled, chunk, args.step_tokens)
                results.append(result)
                print(json.dumps(result), flush=True)
    record = {
        "package": str(args.package),
        "device": str(package.device),
        "batch_size": generation.batch_size,
        "max_seq_len": generation.max_seq_len,
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
