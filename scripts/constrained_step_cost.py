"""What holding a row to a grammar costs a decode step, in-process: one sequence decoded free, then
the same held to a grammar that never ends on its own (lowercase words: a JSON string's inside,
where a structured answer spends most of its tokens); alternating rounds, each the milliseconds a
token after the first, and their median.

usage: python scripts/constrained_step_cost.py PKG --tokenizer tokenizer.json [--tokens 128]
       [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import aotc_runtime
from aotc_runtime.decode_engine import DecodeEngine
from aotc_runtime.generation_request import GenerationRequest
from aotc_runtime.token_grammar import Vocabulary

WORDS = "start: /[a-z ]+/"


def per_token_ms(package, request: GenerationRequest) -> float:
    """Milliseconds a token of one sequence's decode, the first token's step left out: the wall
    time from the first token to the last over the tokens between (steps queued ahead overlap, so
    a step's own call does not show its cost)."""
    engine = DecodeEngine(package)
    engine.join(0, request)
    made = len(engine.step())  # the prompt's step and the first token
    started = time.perf_counter()
    while engine.active:
        made += len(engine.step())
    return (time.perf_counter() - started) * 1000 / (made - 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument(
        "--tokenizer", required=True, help="a tokenizer.json of the model's vocabulary"
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    from tokenizers import Tokenizer

    package = aotc_runtime.load(args.package)
    generation = package.generation
    vocabulary = Vocabulary(
        Tokenizer.from_file(args.tokenizer), generation.vocab_size, generation.eos_token_ids
    )
    grammar = vocabulary.lark(WORDS)
    prompt = tuple(range(5, 37))
    free = GenerationRequest(prompt, args.tokens, ignore_eos=True)
    held = GenerationRequest(prompt, args.tokens, ignore_eos=True, grammar=grammar)
    per_token_ms(package, free)  # warm: graphs captured, caches made
    per_token_ms(package, held)
    times: dict = {"free": [], "constrained": []}
    for _ in range(args.rounds):
        times["free"].append(per_token_ms(package, free))
        times["constrained"].append(per_token_ms(package, held))
    report: dict = {
        kind: {"median_ms": statistics.median(values), "max_ms": max(values), "rounds": values}
        for kind, values in times.items()
    }
    report["ratio"] = report["constrained"]["median_ms"] / report["free"]["median_ms"]
    report["device"] = str(package.device)
    if package.device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
