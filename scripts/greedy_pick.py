"""What the decode step's greedy pick costs: each row's first largest logit and whether its logits
are finite, from [B, vocab] logits, as the sampler (aotc_runtime/sampling.py) does it and as it did
before, side by side on the same tensors.

- `three reductions`: the pick as it was (the largest value twice, for the check and for the
  mask, and an argmax);
- `one reduction`: `sampling.greedy_pick` as on the CPU, `torch.max` over the row;
- `two stages`: `sampling.greedy_pick` as on CUDA, the largest of each part of the row, then of
  the parts.

On CUDA each variant's call is captured --calls times in one CUDA graph and the graph replayed
--rounds times (the median replay over --calls is a call's cost without its launch); on the CPU
the calls are timed one by one. All three must give the same tokens and marks, or the run stops.

usage: python scripts/greedy_pick.py [--device cuda] [--vocab 49152,50257,128256,151936]
       [--batch 1,8,32] [--dtype bf16,fp32] [--calls 50] [--rounds 20] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))
from aotc_runtime.sampling import greedy_pick, parts_of  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def three_reductions(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    failed = ~logits.amax(dim=-1).isfinite()
    tokens = logits.argmax(dim=-1).masked_fill(failed, 0)
    return tokens, ~logits.amax(dim=-1).isfinite()


VARIANTS = {
    "three reductions": three_reductions,
    "one reduction": lambda logits: greedy_pick(logits, 1),  # the sampler's pick on the CPU
    "two stages": lambda logits: greedy_pick(logits, parts_of(logits.shape[1])),  # on CUDA
}


def time_cuda(pick, logits: torch.Tensor, calls: int, rounds: int) -> list[float]:
    """µs per call of each replay of a graph of `calls` calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            pick(logits)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            pick(logits)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return times


def time_cpu(pick, logits: torch.Tensor, calls: int, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            pick(logits)
        times.append((time.perf_counter() - started) * 1e6 / calls)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--vocab", default="49152,50257,128256,151936")
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--dtype", default="bf16,fp32")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    timer = time_cuda if device.type == "cuda" else time_cpu
    records = []
    for vocab in (int(v) for v in args.vocab.split(",")):
        for batch in (int(b) for b in args.batch.split(",")):
            for dtype_name in args.dtype.split(","):
                g = torch.Generator().manual_seed(vocab + batch)
                logits = torch.randn(batch, vocab, generator=g).to(DTYPES[dtype_name]).to(device)
                logits[0, vocab // 2] = float("nan")  # one failed row, as the check must see
                answers = [[t.tolist() for t in pick(logits)] for pick in VARIANTS.values()]
                if any(answer != answers[0] for answer in answers):
                    raise SystemExit(f"the variants disagree at vocab {vocab}, batch {batch}")
                record = {"vocab": vocab, "batch": batch, "dtype": dtype_name,
                          "parts": parts_of(vocab)}  # fmt: skip
                for name, pick in VARIANTS.items():
                    times = sorted(timer(pick, logits, args.calls, args.rounds))
                    record[name] = {
                        "p50_us": round(statistics.median(times), 2),
                        "p90_us": round(times[int(0.9 * (len(times) - 1))], 2),
                    }
                records.append(record)
                print(
                    f"vocab {vocab:>6} batch {batch:>2} {dtype_name}: "
                    + ", ".join(f"{name} {record[name]['p50_us']} µs" for name in VARIANTS),
                    flush=True,
                )
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "torch": torch.__version__, "calls": args.calls, "rounds": args.rounds}  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
