"""Aggregate decode tokens/s of text-generation packages at a full batch, side by side.

Every row of each package holds a sequence (greedy, random 32-token prompts, --new tokens each,
no end-of-sequence id), run through the decode engine as `aotc serve` runs it; the packages take
turns, round by round, after one untimed generation each (on CUDA it captures the decode graph).
The prefill step is not timed. Used to compare a package exported before a change with one
exported after it (docs/benchmarks.md, "Rows in use").

usage: python scripts/rows_ab.py PKG_DIR... [--new 224] [--rounds 5] [--json OUT.json]
"""

from __future__ import annotations

import argparse
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

PROMPT_TOKENS = 32


def synchronize(package) -> None:
    if package.device.type == "cuda":
        torch.cuda.synchronize()


def full_batch_rate(package, new_tokens: int) -> float:
    """Decode tokens/s of one generation with every row of the package's batch in use."""
    generation = package.generation
    engine = DecodeEngine(package)
    draw = torch.Generator().manual_seed(0)
    for row in range(generation.batch_size):
        prompt = torch.randint(3, generation.vocab_size, (PROMPT_TOKENS,), generator=draw)
        engine.join(
            row, GenerationRequest(tuple(prompt.tolist()), new_tokens, GREEDY, eos_token_ids=())
        )
    engine.step()  # the prefill and each row's first token: not decode
    synchronize(package)
    made, start = 0, time.perf_counter()
    while engine.active:
        made += len(engine.step())
    synchronize(package)
    return made / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--new", type=int, default=224, help="new tokens per sequence")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    packages = {folder: aotc_runtime.load(folder) for folder in args.packages}
    for package in packages.values():
        full_batch_rate(package, args.new)  # untimed: warm-up, graph capture
    rates: dict = {folder: [] for folder in packages}
    for _ in range(args.rounds):
        for folder, package in packages.items():
            rates[folder].append(full_batch_rate(package, args.new))
    report = {
        str(folder): {
            "batch": packages[folder].generation.batch_size,
            "picks_a_dim": packages[folder].fixed_picks is None,
            "median_tokens_per_s": round(statistics.median(rounds), 1),
            "rounds": [round(rate, 1) for rate in rounds],
        }
        for folder, rounds in rates.items()
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
