"""The CUDA decode attention's spans combined three ways, and one span read in wider blocks, timed
as a package's decode step launches them: every kernel with programmatic dependent launch (PDL),
a model's layers' calls one after another in one CUDA graph.

- split + combine: the split count a package picks (split_count), a second kernel combining the
  spans (aotc/kernels/attention.py as a package ran it before the fold);
- fold: the last span of each token and head to finish combines them, counting on a counter
  buffer the call zeroes (a fill kernel beside it in this graph);
- fold, counters kept: the same on a buffer made once per layer, which the kernel leaves at zero:
  the fold without the fill, its best case;
- one span in blocks of 64, 128 or 256 keys, 4 or 8 warps: no combine at all, each (token, head)
  walks its whole context;
- with --splits 8,16: the fold with counters kept at each of those span counts too (only the
  spans a context fills store and count, so more spans cost a short context little).

Each form is checked against the reference it replaces (aotc/export/cached_attention.reference).
Prints a table; --json keeps the records.

usage: python scripts/attention_fold.py [--replays 50] [--contexts 32,96,176,320,1024]
    [--splits 8,16] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# a decode step's query, cache and rows at a context, as the split-count sweep makes them
from attention_splits import inputs  # noqa: E402

SHAPES = {  # name: (query heads, key/value heads, head dim, layers)
    "llama-3.2-1b": (32, 8, 64, 16),
    "qwen3-0.6b": (16, 8, 128, 28),
    "smollm2-135m": (9, 3, 64, 30),
}


class _Programmatic:
    """A Triton kernel launched with PDL (as a `--pdl` package launches aotc's kernels)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return functools.partial(self.kernel[grid], launch_pdl=True)


def step_time_us(calls, replays: int) -> float:
    """The median µs per call of `calls` (one a layer) captured in one CUDA graph."""
    import torch

    for _ in range(3):
        for call in calls:
            call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        started = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) / len(calls) * 1e6)
    return statistics.median(times)


def forms(batch: int, heads: int, more_splits: list[int]) -> list[tuple[str, int, dict]]:
    from aotc.kernels.split_attention import split_count

    splits = split_count(batch, heads)
    out = [
        ("split + combine", splits, {}),
        ("fold", splits, {"fold": True}),
        ("fold, counters kept", splits, {"fold": True, "counts": "kept"}),
    ]
    for count in more_splits:
        if count != splits:
            out.append(
                (f"fold, counters kept, {count} spans", count, {"fold": True, "counts": "kept"})
            )
    for block_n, warps in ((64, 4), (128, 4), (256, 4), (256, 8)):
        out.append(
            (f"one span, {block_n} keys, {warps} warps", 1, {"block_n": block_n, "warps": warps})
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--contexts", default="32,96,176,320,1024")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--splits", default="", help="span counts to fold at beside the package's")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    from aotc.export.cached_attention import reference
    from aotc.kernels.attention import attend

    if not torch.cuda.is_available():
        parser.error("this times a CUDA kernel: run it on a GPU machine")
    more_splits = [int(s) for s in args.splits.split(",") if s]
    records = []
    for name, (heads, kv_heads, dim, layers) in SHAPES.items():
        for batch in (int(b) for b in args.batches.split(",")):
            for context in (int(c) for c in args.contexts.split(",")):
                step = (*inputs(batch, heads, kv_heads, dim, context), dim**-0.5, 0, 0.0)
                want = reference(*step).float()
                for label, splits, options in forms(batch, heads, more_splits):
                    calls = []
                    for _ in range(layers):
                        named = dict(options)
                        if named.get("counts") == "kept":
                            named["counts"] = torch.zeros(
                                batch * heads, dtype=torch.int32, device="cuda"
                            )
                        calls.append(
                            functools.partial(attend, *step, splits, launch=_Programmatic, **named)
                        )
                    error = float((calls[0]().float() - want).abs().max())
                    us = step_time_us(calls, args.replays)
                    print(
                        f"{name:13s} batch {batch} context {context:5d} splits {splits:2d} "
                        f"{label:28s} {us:7.2f} us  max abs error {error:.2e}",
                        flush=True,
                    )
                    records.append(
                        {"shape": name, "batch": batch, "context": context, "form": label,
                         "splits": splits, "us_per_call": round(us, 3), "max_abs_error": error}
                    )  # fmt: skip
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name()}
        args.json.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
