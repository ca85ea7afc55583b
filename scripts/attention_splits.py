"""The CUDA decode attention (aotc/kernels/attention.py): split 1..16 ways over the context, and
its launch options at the split count a package picks.

For each model shape, batch and context length: one decode step's attention (a token per row, the
rows `context` positions in, packed as the engine packs a step), checked against the reference it
replaces (aotc/export/cached_attention.reference), then timed as a decode step runs it: 32 layers'
calls captured in one CUDA graph, replayed --replays times; the median per call. The row marked
"*" is the split count the package picks (split_count). With --options, the picked split count is
timed again for each warp count and number of keys per block (BLOCK_N). Prints a table; --json
keeps the records.

usage: python scripts/attention_splits.py [--replays 50] [--options] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

SHAPES = {  # name: (query heads, key/value heads, head dim)
    "smollm2-135m": (9, 3, 64),
    "llama-3.2-1b": (32, 8, 64),
    "qwen3-0.6b": (16, 8, 128),
}
CACHE = 1024
LAYERS = 32  # calls per graph: a decode step's worth
SPLITS = (1, 2, 4, 8, 16)


def inputs(batch: int, heads: int, kv_heads: int, dim: int, context: int):
    """(query [1, heads, batch, dim], keys, values, rows, positions) of a decode step in bf16."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    query = torch.randn(1, heads, batch, dim, device="cuda", generator=g, dtype=torch.bfloat16)
    keys = torch.randn(batch, CACHE + 1, kv_heads, dim, device="cuda", generator=g)
    values = torch.randn(batch, CACHE + 1, kv_heads, dim, device="cuda", generator=g)
    rows = torch.arange(batch, device="cuda")
    positions = torch.full((batch,), context - 1, dtype=torch.int64, device="cuda")
    return query, keys.to(torch.bfloat16), values.to(torch.bfloat16), rows, positions


def graph_time_us(call, replays: int, layers: int = LAYERS) -> float:
    """The median µs of one `call`, `layers` calls captured in one CUDA graph and replayed
    `replays` times (scripts/attention_tiles.py times its kernels this way too)."""
    import torch

    for _ in range(3):  # compile and warm up outside the graph
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            call()
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        started = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) / layers * 1e6)
    return statistics.median(times)


OPTIONS = [
    {"warps": warps, "block_n": block_n} for warps in (1, 2, 4, 8) for block_n in (32, 64, 128)
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--options", action="store_true", help="time the launch options too")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    from aotc.export.cached_attention import reference
    from aotc.kernels.attention import attend, split_count

    if not torch.cuda.is_available():
        parser.error("this times a CUDA kernel: run it on a GPU machine")
    records = []
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for batch in (1, 8):
            for context in (64, 256, 1024):
                step = (*inputs(batch, heads, kv_heads, dim, context), dim**-0.5, 0, 0.0)
                want = reference(*step).float()
                chosen = split_count(batch, heads)
                tried = [(splits, {}) for splits in SPLITS]
                if args.options:
                    tried += [(chosen, options) for options in OPTIONS]
                for splits, options in tried:
                    call = functools.partial(attend, *step, splits, **options)
                    error = float((call().float() - want).abs().max())
                    us = graph_time_us(call, args.replays)
                    mark = "*" if splits == chosen and not options else " "
                    print(
                        f"{name:13s} batch {batch} context {context:5d} splits {splits:2d}{mark} "
                        f"{options or ''} {us:7.2f} us  max abs error {error:.2e}",
                        flush=True,
                    )
                    records.append(
                        {"shape": name, "batch": batch, "context": context, "splits": splits,
                         "chosen": splits == chosen, **options, "us_per_call": round(us, 3),
                         "max_abs_error": error}
                    )  # fmt: skip
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name()}
        args.json.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
