"""Decode speed of a text-generation package against transformers' eager `generate`, in one process.

For each model file: `aotc export --task text-generation` and `aotc build` (fresh processes), then,
interleaved round by round, greedy generation of --new tokens after a --prompt-token prompt
(batch 1) by the package and by transformers (its default dynamic cache), both from the same
weights. Each side is timed for 1 new token (the prefill and the first token) and for --new
tokens; the decode rate is (new - 1) / (t_new - t_1). Medians over --rounds; the tokens of both
sides are compared (they must be equal).

    python scripts/generate_bench.py tests/zoo/gpt2.py tests/zoo/llama.py --gpt2-124m \
        --prompt-tokens 16 --new 48 --rounds 3 --out docs/bench/generate_cpu.json
(the zoo's small LMs have 64 positions: prompt and new tokens must fit in them)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AOTC = [sys.executable, "-m", "aotc"]

GPT2_124M = """
from transformers import GPT2Config, GPT2LMHeadModel


def get_model():
    return GPT2LMHeadModel(GPT2Config())  # GPT-2 124M's shape, random weights
"""


def build(model_file: Path, work: Path, args) -> Path:
    artifact, package = work / f"{model_file.stem}.pt2", work / f"{model_file.stem}_pkg"
    max_len = args.prompt_tokens + args.new
    for command in (
        [*AOTC, "export", str(model_file), "--task", "text-generation", "--max-seq-len",
         str(max_len), "-o", str(artifact), "--force"],
        [*AOTC, "build", str(artifact), "-o", str(package), "--device", args.device,
         "--precision", args.precision, "--force", "--quiet"],
    ):  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(command[2:4])} failed: {done.stderr.strip()[-500:]}")
    return package


def eager_model(model_file: Path, device: str, dtype):
    spec = importlib.util.spec_from_file_location(model_file.stem, model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import torch

    torch.manual_seed(0)  # as aotc export constructs it
    return module.get_model().eval().to(device, dtype)


def measure(model_file: Path, work: Path, args) -> dict:
    import torch

    import aotc_runtime

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    started = time.perf_counter()
    package = aotc_runtime.load(build(model_file, work, args))
    build_s = time.perf_counter() - started
    model = eager_model(model_file, args.device, dtype)
    vocab = package.manifest.generation.vocab_size
    ids = torch.randint(
        0, vocab, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0)
    )

    def ours(n: int):
        return package.generate(ids, max_new_tokens=n, eos_token_ids=[])

    def theirs(n: int):
        with torch.no_grad():
            out = model.generate(
                ids.to(args.device), attention_mask=torch.ones_like(ids).to(args.device),
                max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
            )  # fmt: skip
        return out.cpu()

    def timed(fn, n: int) -> tuple:
        if args.device == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        out = fn(n)
        if args.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - began, out

    samples: dict = {"aotc": {1: [], args.new: []}, "transformers": {1: [], args.new: []}}
    outputs = {}
    for fn in (ours, theirs):  # warm-up
        fn(2)
    for _ in range(args.rounds):
        for name, fn in (("aotc", ours), ("transformers", theirs)):
            for n in (1, args.new):
                seconds, out = timed(fn, n)
                samples[name][n].append(seconds)
                outputs[name] = out
    same = outputs["aotc"].tolist() == outputs["transformers"].tolist()
    result = {"model": model_file.name, "build_s": round(build_s, 1), "tokens_equal": same}
    for name, times in samples.items():
        first, whole = statistics.median(times[1]), statistics.median(times[args.new])
        result[name] = {
            "first_token_ms": round(first * 1e3, 2),
            "decode_tokens_per_s": round((args.new - 1) / (whole - first), 1),
        }
    result["decode_speedup"] = round(
        result["aotc"]["decode_tokens_per_s"] / result["transformers"]["decode_tokens_per_s"], 2
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--gpt2-124m", action="store_true", help="add GPT2Config() (124M)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    records = []
    with tempfile.TemporaryDirectory(prefix="aotc-generate-bench-") as scratch:
        work = Path(scratch)
        models = [m.resolve() for m in args.models]
        if args.gpt2_124m:
            models.append(work / "gpt2_124m.py")
            models[-1].write_text(GPT2_124M)
        for model_file in models:
            record = measure(model_file, work, args)
            print(json.dumps(record), flush=True)
            records.append(record)
    if args.out:
        meta = {"date": time.strftime("%Y-%m-%d"), "device": args.device, "args": vars(args)}
        meta["args"] = {k: str(v) for k, v in meta["args"].items()}
        args.out.write_text(json.dumps({"meta": meta, "records": records}, indent=2) + "\n")


if __name__ == "__main__":
    main()
