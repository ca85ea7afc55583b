"""What a decode step costs as the package's cache grows while the context stays: one small Llama
exported for several --max-seq-len, built for one device, each package's decode step timed with
the same context (--context tokens held by every row), interleaved round by round in one process.

A step should cost what its context asks for, not what the cache could hold: the ratio of each
length's median to the shortest's is the figure (the target is at most 1.1 at 4,096 against 256
for a 64-token context).

    python scripts/step_cost.py --lengths 256,4096 --context 64 --batch 4 --threads 1 \
        --out docs/bench/step_cost_cpu.json
    python scripts/step_cost.py --device cuda --lengths 256,4096 --context 64 --batch 4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def get_model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192,
    )).eval()
"""


def build(folder: Path, length: int, batch: int, device: str) -> Path:
    aotc = [sys.executable, "-m", "aotc"]
    artifact, package = folder / f"lm_{length}.pt2", folder / f"lm_{length}_pkg"
    subprocess.run(
        [*aotc, "export", str(folder / "lm.py"), "--task", "text-generation", "--max-seq-len",
         str(length), "--batch-size", str(batch), "-o", str(artifact)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    subprocess.run(
        [*aotc, "build", str(artifact), "--device", device, "-o", str(package), "--quiet"],
        check=True,
    )
    return package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="256,4096", help="comma list of --max-seq-len")
    parser.add_argument("--context", type=int, default=64, help="tokens each row holds")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch)")
    parser.add_argument("--steps", type=int, default=200, help="timed decode steps a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    import aotc_runtime

    torch.set_num_threads(args.threads)
    lengths = [int(n) for n in args.lengths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "lm.py").write_text(MODEL)
        packages = {
            n: aotc_runtime.load(build(folder, n, args.batch, args.device)) for n in lengths
        }
        device = torch.device(args.device)
        tokens = torch.zeros(args.batch, 1, dtype=torch.long, device=device)
        held = torch.full((args.batch,), args.context, dtype=torch.long, device=device)
        fed = torch.ones(args.batch, dtype=torch.long, device=device)
        per_step: dict[int, list] = {n: [] for n in lengths}
        with torch.inference_mode():
            for package in packages.values():  # warm: first calls allocate
                for _ in range(5):
                    package(tokens, held, fed)
            for _ in range(args.rounds):
                for n, package in packages.items():
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(args.steps):  # the same step: its context stays args.context
                        package(tokens, held, fed)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    per_step[n].append((time.perf_counter() - start) / args.steps * 1e6)
    base = sorted(per_step[lengths[0]])[len(per_step[lengths[0]]) // 2]
    rows = []
    for n in lengths:
        times = sorted(per_step[n])
        median = times[len(times) // 2]
        rows.append({"max_seq_len": n, "step_us_median": round(median, 1),
                     "step_us_min": round(times[0], 1), "step_us_max": round(times[-1], 1),
                     "ratio_to_shortest": round(median / base, 3)})  # fmt: skip
        print(f"max_seq_len {n:>6}: {median:8.1f} us a step (median of {args.rounds} rounds of "
              f"{args.steps}), {median / base:.3f}x the shortest")  # fmt: skip
    result = {"date": time.strftime("%Y-%m-%d"), "device": args.device, "threads": args.threads,
              "batch": args.batch, "context": args.context, "rows": rows}  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
