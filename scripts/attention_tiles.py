"""Join steps' CUDA attention (aotc/kernels/attention.py): per token against tiled, timed.

Every token per token (the path before the tiled kernel) against whole blocks of a chunk tiled.
A 32-row cache of 768 positions (GPT-2's 32x769 buffers); a decode step (one token a row) and join
steps: 31 rows decoding at positions between 100 and 700 and one row fed the first 256 or 512
tokens of its prompt, packed after `--before` decode tokens (16: its edges are ragged; 0: its
blocks start at the step's first token). Each is timed as a step runs it: 12 layers' calls
captured in one CUDA graph, replayed --replays times; the median per call, in microseconds, and
the largest difference between the two paths' outputs. --block-m times other tile heights too.

usage: python scripts/attention_tiles.py [--replays 50] [--before 16] [--block-m 32 64 128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from attention_splits import graph_time_us  # noqa: E402  (the same timing as the split sweep)

SHAPES = {  # name: (query heads, key/value heads, head dim)
    "gpt2-124m": (12, 12, 64),
    "llama-3.2-1b": (32, 8, 64),
    "llama-3-8b": (32, 8, 128),
}
BATCH, LENGTH = 32, 768
LAYERS = 12  # calls per graph: GPT-2's step
STEPS = {"decode": 0, "join 256": 256, "join 512": 512}  # the joining row's chunk


def step(heads: int, kv_heads: int, dim: int, chunk: int, before: int):
    """(query, keys, values, rows, positions) in bf16 of one step (the module's doc)."""
    import torch

    from aotc_runtime.decode_step import pack

    g = torch.Generator().manual_seed(chunk)
    context = torch.randint(100, 700, (BATCH,), generator=g).tolist()
    feeds = [(row, context[row], [0]) for row in range(BATCH)]
    if chunk:  # the joining row takes the place of one decoding row
        feeds[before] = (before, 0, [0] * chunk)
    rows, positions = (t.cuda() for t in pack(feeds)[1:3])
    tokens = rows.shape[0]
    cache = (BATCH, LENGTH + 1, kv_heads, dim)
    keys = torch.randn(cache, device="cuda", dtype=torch.bfloat16)
    values = torch.randn(cache, device="cuda", dtype=torch.bfloat16)
    query = torch.randn(1, tokens, heads, dim, device="cuda", dtype=torch.bfloat16)
    return query.transpose(1, 2), keys, values, rows, positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--before", type=int, default=16, help="decode tokens before the chunk")
    parser.add_argument("--block-m", type=int, nargs="+", default=None, help="tile heights")
    args = parser.parse_args()
    import torch

    from aotc.kernels.attention import attend
    from aotc.kernels.split_attention import BLOCK_M, split_count

    if not torch.cuda.is_available():
        parser.error("this times a CUDA kernel: run it on a GPU machine")
    heights = args.block_m or [BLOCK_M]
    for name, (heads, kv_heads, dim) in SHAPES.items():
        splits = split_count(BATCH, heads)
        for label, chunk in STEPS.items():
            inputs = (*step(heads, kv_heads, dim, chunk, args.before), dim**-0.5, 0, 0.0)

            def call(block_m: int, inputs=inputs, splits=splits):
                return attend(*inputs, splits, block_m=block_m)

            old = graph_time_us(lambda: call(0), args.replays, LAYERS)
            times = []
            for block_m in heights:
                us = graph_time_us(lambda block_m=block_m: call(block_m), args.replays, LAYERS)
                error = float((call(block_m).float() - call(0).float()).abs().max())
                times.append(f"tiled {block_m:3d}: {us:7.2f} us (max diff {error:.1e})")
            print(f"{name:12s} {label:8s} per token {old:7.2f} us  " + "  ".join(times), flush=True)


if __name__ == "__main__":
    main()
