"""Decode speed of a text-generation package against transformers' `generate`, in one process.

For each model file: `aotc export --task text-generation` once and `aotc build` per --precision
(fresh processes), then the timing `aotc bench` does on a text-generation package
(aotc/bench/generation.py, whose docstring says what is measured and how): greedy generation of
--new tokens after a --prompt-tokens prompt (batch 1) by each contender, interleaved round by
round, all from the same weights:

  aotc            the package, through `package.stream` (its rows say "package")
  eager           transformers' `generate` (its default dynamic cache)
  static-compile  transformers' `generate` with cache_implementation="static" and the model's
                  forward under torch.compile(fullgraph=True; reduce-overhead on CUDA, default on
                  CPU); if it raises, its row holds the error's first line and the others go on
  gpt-fast        a gpt-fast-style decoder of the Llama family (aotc/bench/gpt_fast.py): static
                  cache in buffers, fused q/k/v and gate/up, the decode step compiled whole; the
                  PyTorch-native decode a package must beat (a GPT-2 row holds its refusal)

This script adds what `aotc bench` leaves out: models given as files (or GPT-2 124M's and
Llama-3.2-1B's and Qwen3-0.6B's shapes), several precisions in one run, build times and package sizes, and on CUDA
the package's GPU memory (always) and, with --bandwidth, decode as a fraction of the
memory-bandwidth floor. One JSON line per model and precision; --out collects them.

GPU targets (H100), one run each:

    python scripts/generate_bench.py --gpt2-124m --device cuda --precision bf16,fp32 \
        --prompt-tokens 32 --new 128 --rounds 5 --bandwidth --out docs/bench/generate_gpt2_h100.json
    python scripts/generate_bench.py --llama-1b --device cuda --precision bf16 --contenders aotc,eager \
        --prompt-tokens 512 --new 128 --max-seq-len 1024 --rounds 5 --bandwidth \
        --out docs/bench/generate_llama1b_h100.json
    python scripts/generate_bench.py --llama-1b --qwen3-0.6b --device cuda --precision bf16 \
        --contenders aotc,gpt-fast --prompt-tokens 32 --new 288 --rounds 3 --bandwidth

CPU (the zoo's small LMs have 64 positions: prompt and new tokens must fit in them):

    python scripts/generate_bench.py tests/zoo/gpt2.py tests/zoo/llama.py --gpt2-124m \
        --prompt-tokens 16 --new 48 --rounds 3 --out docs/bench/generate_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AOTC = [sys.executable, "-m", "aotc"]
CONTENDERS = ("aotc", "eager", "static-compile", "gpt-fast")
MB = 1e6  # sizes are reported in MB (10^6 bytes)

GPT2_124M = """
from transformers import GPT2Config, GPT2LMHeadModel


def get_model():
    return GPT2LMHeadModel(GPT2Config())  # GPT-2 124M's shape, random weights
"""

LLAMA_1B = """
from transformers import LlamaConfig, LlamaForCausalLM


def get_model():  # Llama-3.2-1B's shape (GQA, tied embeddings), random weights
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=True,
        )
    )
"""


QWEN3_06B = """
from transformers import Qwen3Config, Qwen3ForCausalLM


def get_model():  # Qwen3-0.6B's shape (28 layers, head_dim 128, q/k norms), random weights
    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
        )
    )
"""


PACKAGE_NAME = "package"  # aotc.bench.generation.PACKAGE: the package's row


def run_aotc(command: list) -> float:
    """Seconds an `aotc` command took; its stderr's tail if it fails."""
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[2:4])} failed: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - started


def export(model_file: Path, work: Path, args) -> tuple[Path, float]:
    """The model's exported step (fp32; every precision's build starts from it) and its seconds."""
    artifact = work / f"{model_file.stem}.pt2"
    seconds = run_aotc(
        [*AOTC, "export", str(model_file), "--task", "text-generation", "--max-seq-len",
         str(args.max_seq_len), "-o", str(artifact), "--force"]
    )  # fmt: skip
    return artifact, seconds


def build(artifact: Path, precision: str, scheme: str, args) -> tuple[Path, float]:
    quantized = [] if scheme == "none" else ["--quantize", scheme]
    if scheme == "int4-weight-only":
        quantized += ["--group-size", str(args.group_size)]
    name = precision if scheme == "none" else f"{precision}_{scheme}"
    package = artifact.with_name(f"{artifact.stem}_{name}_pkg")
    seconds = run_aotc(
        [*AOTC, "build", str(artifact), "-o", str(package), "--device", args.device,
         "--precision", precision, "--mode", args.mode, *quantized, "--force", "--quiet"]
    )  # fmt: skip
    return package, seconds


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / MB


def measure_precision(
    model_file: Path, artifact: Path, export_s: float, precision: str, scheme: str, args
) -> dict:
    """Build the artifact at this precision (quantized as `scheme` says, "none" for not) and time
    it (aotc/bench/generation.py's measure); a quantized package alone, without baselines."""
    package_dir, build_s = build(artifact, precision, scheme, args)
    # an int4 package meets gpt-fast's int4 mode (aotc/bench/generation.py); the others have no
    # quantized contender, so they are timed alone beside their bf16 package's row
    if scheme == "none":
        contenders = args.contenders
    elif scheme == "int4-weight-only":
        contenders = [c for c in args.contenders if c in (PACKAGE_NAME, "gpt-fast")]
    else:
        contenders = [PACKAGE_NAME]
    return {
        "export_s": round(export_s, 1),
        "build_s": round(build_s, 1),
        "quantize": scheme,
        **measure_package(model_file, artifact, package_dir, precision, args, contenders),
    }


def measure_package(
    model_file: Path, artifact: Path, package_dir: Path, precision: str, args, contenders=None
) -> dict:
    from aotc.bench.generation import PACKAGE, GenerationBench, measure

    spec = GenerationBench(
        package=package_dir,
        model=(str(model_file), None),
        against=tuple(c for c in (contenders or args.contenders) if c != PACKAGE),
        device=args.device,
        precision=precision,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new,
        rounds=args.rounds,
        warmup=1,
        bandwidth_bytes_per_s=args.bandwidth_bytes_per_s,
        artifact=artifact,
    )
    return {
        "model": model_file.name,
        "package": package_dir.name,
        "precision": precision,
        "mode": args.mode,
        "package_mb": round(folder_mb(package_dir), 1),
        **measure(spec),
    }


def built_packages(model_file: Path, args) -> Iterator[dict]:
    """Records of --built packages (already built from the model; no export or build here), each
    timed against the model with the weights of the artifact its manifest names."""
    import aotc_runtime

    for folder in args.built:
        manifest = aotc_runtime.load(folder).manifest
        artifact = Path(manifest.source.artifact) if manifest.source else None
        yield measure_package(model_file, artifact, folder, manifest.precision, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--gpt2-124m", action="store_true", help="add GPT2Config() (124M)")
    parser.add_argument("--llama-1b", action="store_true", help="add Llama-3.2-1B's shape")
    parser.add_argument(
        "--qwen3-0.6b", dest="qwen3_0_6b", action="store_true", help="add Qwen3-0.6B's shape"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--precision", default="fp32", help="comma list of fp32, bf16, fp16: a package each"
    )
    parser.add_argument("--mode", choices=("default", "reduce-overhead", "max-autotune"))
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, help="the package's KV cache [prompt + new]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--contenders", help=f"comma list of {', '.join(CONTENDERS)} [cuda: all; cpu: aotc,eager]"
    )
    parser.add_argument(
        "--bandwidth", action="store_true", help="cuda: decode against the memory-bandwidth floor"
    )
    parser.add_argument(
        "--built",
        type=lambda text: [Path(p) for p in text.split(",")],
        default=[],
        help="comma list of packages built from the one model given: time them as they are",
    )
    parser.add_argument(
        "--quantize",
        default="none",
        help="comma list of none and aotc build --quantize schemes: a package each, per precision",
    )
    parser.add_argument("--group-size", type=int, default=128, help="int4-weight-only's groups")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.quantize = args.quantize.split(",")
    cuda = args.device == "cuda"
    args.mode = args.mode or ("reduce-overhead" if cuda else "default")
    args.max_seq_len = args.max_seq_len or args.prompt_tokens + args.new
    args.precision = args.precision.split(",")
    default_contenders = ",".join(CONTENDERS if cuda else CONTENDERS[:2])
    args.contenders = (args.contenders or default_contenders).split(",")
    if bad := [p for p in args.precision if p not in ("fp32", "bf16", "fp16")]:
        parser.error(f"unknown precision {bad[0]!r}; give fp32, bf16 or fp16")
    if bad := [c for c in args.contenders if c not in CONTENDERS]:
        parser.error(f"unknown contender {bad[0]!r}; give {', '.join(CONTENDERS)}")
    if "aotc" not in args.contenders:
        parser.error("the contenders must include aotc (the others are compared with it)")
    args.contenders = ["package" if c == "aotc" else c for c in args.contenders]
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.new < 2:
        parser.error("--new must be at least 2 (the decode rate is over tokens 2..new)")
    if args.prompt_tokens + args.new > args.max_seq_len:
        parser.error("--prompt-tokens + --new exceed --max-seq-len")

    import torch
    import transformers

    from aotc.bench.generation import copy_bandwidth

    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU")
    args.bandwidth_bytes_per_s = None
    if args.bandwidth and cuda:
        args.bandwidth_bytes_per_s = copy_bandwidth()
    elif args.bandwidth:
        print("--bandwidth: CUDA only, skipped", file=sys.stderr)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "args": json.loads(json.dumps(vars(args), default=str)),  # paths as strings
    }
    records = []
    with tempfile.TemporaryDirectory(prefix="aotc-generate-bench-") as scratch:
        work = Path(scratch)
        models = [m.resolve() for m in args.models]
        for flag, name, source in (
            (args.gpt2_124m, "gpt2_124m", GPT2_124M),
            (args.llama_1b, "llama_1b", LLAMA_1B),
            (args.qwen3_0_6b, "qwen3_06b", QWEN3_06B),
        ):
            if flag:
                models.append(work / f"{name}.py")
                models[-1].write_text(source)
        if args.built and len(models) != 1:
            parser.error("--built: give the one model its packages were built from")
        for model_file in models:
            if args.built:
                timed = built_packages(model_file, args)
            else:
                artifact, export_s = export(model_file, work, args)
                timed = (
                    measure_precision(model_file, artifact, export_s, precision, scheme, args)
                    for precision in args.precision
                    for scheme in args.quantize
                )
            for record in timed:
                # other work on the host slows eager most; a figure says what it was taken beside
                record["load_average_1m"] = round(os.getloadavg()[0], 2)
                print(json.dumps(record), flush=True)
                records.append(record)
                if args.out:  # after every record: a run cut short keeps what it measured
                    out = {"meta": meta, "records": records}
                    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
