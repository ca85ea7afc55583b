"""What a join step of a text-generation package spends its time on: a running batch of --running
rows decoding, then, --trials times, one sequence of --prompt-tokens tokens joins and the step that
feeds it its prompt (beside the others' decode) is timed and profiled.

Reports per join step: wall time (host, synchronized), the GPU's kernel time and their difference
(time the GPU sat idle: launches, host work, copies), the number of kernels, and the slowest kernel
families; and the same for a plain decode step of the same batch, for scale.

usage: python scripts/join_profile.py PKG_DIR [--running 31] [--prompt-tokens 256] [--trials 5]
       [--json OUT.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

import torch  # noqa: E402

import aotc_runtime  # noqa: E402
from aotc_runtime.decode_engine import DecodeEngine  # noqa: E402
from aotc_runtime.generation_request import GenerationRequest  # noqa: E402
from aotc_runtime.sampling import GREEDY  # noqa: E402


def timed_step(engine: DecodeEngine) -> tuple[float, list]:
    """(wall ms of one engine step, synchronized, the kernels it ran: (name, µs))."""
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        start = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3
    kernels = [
        (event.name, event.device_time)
        for event in profile.events()
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0
    ]
    return wall, kernels


def unprofiled_step(engine: DecodeEngine) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def summary(walls: list, kernel_lists: list) -> dict:
    gpu = [sum(us for _name, us in kernels) / 1e3 for kernels in kernel_lists]
    families: collections.Counter = collections.Counter()
    for kernels in kernel_lists:
        for name, us in kernels:
            families[name[:60]] += us / len(kernel_lists)
    return {
        "wall_ms_p50": statistics.median(walls),
        "gpu_ms_p50": statistics.median(gpu),
        "kernels": statistics.median(len(k) for k in kernel_lists),
        "slowest_us": [(name, round(us, 1)) for name, us in families.most_common(8)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--running", type=int, default=31)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    package = aotc_runtime.load(args.package)
    vocab = package.generation.vocab_size
    engine = DecodeEngine(package, prefill_chunk=args.prompt_tokens, overlap=False)
    g = torch.Generator().manual_seed(0)

    def prompt(n: int) -> list:
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    new = 8 * args.trials + 64
    for row in range(args.running):
        engine.join(("running", row), GenerationRequest(prompt(16), new, GREEDY))
    for _ in range(4):  # the running rows' prompts in, the decode graph captured
        engine.step()
    joins, join_kernels, decodes, decode_kernels, unprofiled = [], [], [], [], []
    for trial in range(args.trials):
        engine.join(("joining", trial), GenerationRequest(prompt(args.prompt_tokens), 2, GREEDY))
        wall, kernels = timed_step(engine)
        joins.append(wall)
        join_kernels.append(kernels)
        wall, kernels = timed_step(engine)  # the joined row's last token: a decode step
        decodes.append(wall)
        decode_kernels.append(kernels)
        engine.join(("again", trial), GenerationRequest(prompt(args.prompt_tokens), 2, GREEDY))
        unprofiled.append(unprofiled_step(engine))
        engine.step()
    record = {
        "package": str(args.package),
        "running": args.running,
        "prompt_tokens": args.prompt_tokens,
        "join": {
            **summary(joins, join_kernels),
            "wall_ms_unprofiled_p50": statistics.median(unprofiled),
        },
        "decode": summary(decodes, decode_kernels),
    }
    print(json.dumps(record, indent=1))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
