"""Decode speed of a text-generation package against transformers' `generate`, in one process.

For each model file: `aotc export --task text-generation` once and `aotc build` per --precision
(fresh processes), then, interleaved round by round, greedy generation of --new tokens after a
--prompt-tokens prompt (batch 1) by each contender, all from the same weights:

  aotc            the package, through `package.stream` (one CPU tensor a step)
  eager           transformers' `generate` (its default dynamic cache)
  static-compile  transformers' `generate` with cache_implementation="static" and the model's
                  forward under torch.compile(mode="reduce-overhead", fullgraph=True) (CUDA only;
                  if it raises, its result is the error's first line and the others go on)

Every token's arrival on the host is time-stamped (transformers through a streamer), which gives
the time to first token (prefill and first sample), the decode rate (new - 1) / (last token -
first token), and the inter-token latencies (p50, p99 over every gap of every round). Medians over
--rounds; the tokens of each contender are compared with the package's.

On CUDA the script also reports the GPU memory of the package (peak allocated while it loads and
generates once, against its weights and full KV cache) and, with --bandwidth, decode as a fraction
of the memory-bandwidth floor: a decode token reads every weight and the KV cache so far once, so
no implementation can beat device copy bandwidth / those bytes.

GPU targets (H100), one run each:

    python scripts/generate_bench.py --gpt2-124m --device cuda --precision bf16,fp32 \
        --prompt-tokens 32 --new 128 --rounds 5 --bandwidth --out docs/bench/generate_gpt2_h100.json
    python scripts/generate_bench.py --llama-1b --device cuda --precision bf16 --contenders aotc,eager \
        --prompt-tokens 512 --new 128 --max-seq-len 1024 --rounds 5 --bandwidth \
        --out docs/bench/generate_llama1b_h100.json

CPU (the zoo's small LMs have 64 positions: prompt and new tokens must fit in them):

    python scripts/generate_bench.py tests/zoo/gpt2.py tests/zoo/llama.py --gpt2-124m \
        --prompt-tokens 16 --new 48 --rounds 3 --out docs/bench/generate_cpu.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AOTC = [sys.executable, "-m", "aotc"]
CONTENDERS = ("aotc", "eager", "static-compile")
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


def build(artifact: Path, precision: str, args) -> tuple[Path, float]:
    package = artifact.with_name(f"{artifact.stem}_{precision}_pkg")
    seconds = run_aotc(
        [*AOTC, "build", str(artifact), "-o", str(package), "--device", args.device,
         "--precision", precision, "--mode", args.mode, "--force", "--quiet"]
    )  # fmt: skip
    return package, seconds


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / MB


def eager_model(model_file: Path, device: str, dtype):
    spec = importlib.util.spec_from_file_location(model_file.stem, model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import torch

    torch.manual_seed(0)  # as aotc export constructs it: every instance has the same weights
    model = module.get_model().eval().to(device, dtype)
    # the package is asked for no end-of-sequence token (eos_token_ids=[]): transformers must not
    # stop at one either, nor suppress it (min_new_tokens would), or the tokens would differ
    model.generation_config.eos_token_id = None
    # with a KV cache, as the package: a config saying use_cache=False (the zoo's, for plain
    # export) would time transformers recomputing the whole sequence at every token
    model.generation_config.use_cache = True
    return model


def compiled_model(model_file: Path, device: str, dtype):
    """transformers' recipe for a fast `generate` (with cache_implementation="static")."""
    import torch

    model = eager_model(model_file, device, dtype)
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    return model


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth() -> float:
    """Device memory bandwidth in bytes/s: a 1 GiB device-to-device copy (read + write), median
    of 20, timed with CUDA events (no host sync overhead inside the interval)."""
    import torch

    size = 1 << 30
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    seconds = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * size / statistics.median(seconds)


def weight_bytes(model) -> int:
    """Bytes of the model's parameters, each storage once (tied embeddings are one matrix, read
    once per token by the LM head)."""
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    return sum(storages.values())


def kv_bytes_per_position(model, batch: int, dtype_bytes: int) -> int:
    """Bytes of K and V, every layer, for one position of every sequence."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * batch * dtype_bytes


def percentile(values: list, q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def new_tokens_differ_at(ours, theirs, prompt: int) -> int | None:
    """Index of the first new token where two outputs differ; None if they are equal."""
    a, b = ours[0, prompt:].tolist(), theirs[0, prompt:].tolist()
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def contender_runs(package, models: dict, ids, args) -> dict:
    """name -> a function of n running one greedy generation of n new tokens, returning (the
    prompt and new tokens on the CPU, the start time, each new token's arrival time)."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    device = args.device

    class Clock(BaseStreamer):
        """Time-stamps each new token as `generate` hands it to the host (it copies each step's
        tokens to the CPU before `put`, so the stamp is after the step's kernels finished)."""

        def __init__(self):
            self.stamps: list = []
            self.prompt_seen = False

        def put(self, value):
            if not self.prompt_seen:  # generate puts the prompt first
                self.prompt_seen = True
                return
            self.stamps.append(time.perf_counter())

        def end(self):
            pass

    def ours(n: int):
        sync(device)
        began, stamps, steps = time.perf_counter(), [], []
        # each step is yielded as a CPU tensor: the yield is after the step's device work
        for step in package.stream(ids, max_new_tokens=n, eos_token_ids=[]):
            stamps.append(time.perf_counter())
            steps.append(step)
        sync(device)
        return torch.cat([ids, torch.stack(steps, 1)], 1), began, stamps

    device_ids = ids.to(device)  # int64, as transformers expects
    mask = torch.ones_like(device_ids)

    def transformers_run(model, **extra):
        def run(n: int):
            clock = Clock()
            sync(device)
            began = time.perf_counter()
            with torch.no_grad():
                out = model.generate(
                    device_ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                    pad_token_id=0, streamer=clock, **extra,
                )  # fmt: skip
            sync(device)
            return out.cpu(), began, clock.stamps

        return run

    runs = {"aotc": ours}
    if "eager" in models:
        runs["eager"] = transformers_run(models["eager"])
    if "static-compile" in models:
        runs["static-compile"] = transformers_run(
            models["static-compile"], cache_implementation="static"
        )
    return runs


def summarize(rounds: list, new: int) -> dict:
    """Medians over rounds of first-token time and decode rate; percentiles over all gaps."""
    firsts, rates, gaps = [], [], []
    for began, stamps in rounds:
        firsts.append(stamps[0] - began)
        rates.append((new - 1) / (stamps[-1] - stamps[0]))
        gaps += [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "first_token_ms": round(statistics.median(firsts) * 1e3, 2),
        "decode_tokens_per_s": round(statistics.median(rates), 1),
        "inter_token_ms": {
            "p50": round(percentile(gaps, 50) * 1e3, 3),
            "p99": round(percentile(gaps, 99) * 1e3, 3),
        },
    }


def measure(model_file: Path, artifact: Path, export_s: float, precision: str, args) -> dict:
    import torch

    import aotc_runtime

    cuda = args.device == "cuda"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    package_dir, build_s = build(artifact, precision, args)

    # The package is loaded and generates once (its warm-up: CUDA graphs captured) before any
    # transformers model exists, and the previous model's objects were freed: the peak below is
    # the package's alone. The driver's count (mem_get_info) is there too because AOTInductor may
    # cudaMalloc its constants (the weights) outside PyTorch's allocator, which
    # max_memory_allocated does not see.
    memory: dict = {}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        free_before = torch.cuda.mem_get_info()[0]
    started = time.perf_counter()
    package = aotc_runtime.load(package_dir)
    load_s = time.perf_counter() - started
    vocab = package.manifest.generation.vocab_size
    ids = torch.randint(
        0, vocab, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0)
    )
    for _ in package.stream(ids, max_new_tokens=args.new, eos_token_ids=[]):
        pass
    if cuda:
        torch.cuda.synchronize()
        memory["peak_allocated_mb"] = round(torch.cuda.max_memory_allocated() / MB, 1)
        memory["peak_reserved_mb"] = round(torch.cuda.max_memory_reserved() / MB, 1)
        memory["device_used_mb"] = round((free_before - torch.cuda.mem_get_info()[0]) / MB, 1)

    # Now the transformers models: eager, and a separate instance (same seed-0 construction, so
    # the same weights) whose forward torch.compile patches, so eager stays eager.
    models = {"eager": eager_model(model_file, args.device, dtype)}
    weights = weight_bytes(models["eager"])
    kv_position = kv_bytes_per_position(models["eager"], ids.shape[0], dtype.itemsize)
    if "eager" not in args.contenders:  # built for its sizes only
        del models["eager"]
    errors: dict = {}
    if "static-compile" in args.contenders:
        try:
            models["static-compile"] = compiled_model(model_file, args.device, dtype)
        except Exception as exc:
            errors["static-compile"] = first_line(exc)
    memory["weights_mb"] = round(weights / MB, 2)
    memory["kv_cache_mb"] = round(kv_position * args.max_seq_len / MB, 2)

    runs = contender_runs(package, models, ids, args)
    runs = {name: run for name, run in runs.items() if name in args.contenders}
    outputs: dict = {}

    def attempt(name: str, run) -> tuple | None:
        """A run; only static-compile's exceptions are caught (a known crash on some versions:
        "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run")."""
        if name != "static-compile":
            return run(args.new)
        try:
            return run(args.new)
        except Exception as exc:
            errors[name] = first_line(exc)
            del runs[name]
            return None

    # warm-up: static-compile compiles (prefill and decode shapes) and records its CUDA graphs
    # over its first calls; the package captured its graphs in the generate above
    for name, run in list(runs.items()):
        for _ in range(3 if name == "static-compile" else 1):
            attempt(name, run)
            if name in errors:
                break
    samples: dict = {name: [] for name in runs}
    for _ in range(args.rounds):  # interleaved: drifts (clocks, heat) hit every contender alike
        for name, run in list(runs.items()):
            done = attempt(name, run)
            if done is not None:
                outputs[name], began, stamps = done
                samples[name].append((began, stamps))

    record = {
        "model": model_file.name,
        "precision": precision,
        "mode": args.mode,
        "export_s": round(export_s, 1),
        "build_s": round(build_s, 1),
        "load_s": round(load_s, 2),
        "package_mb": round(folder_mb(package_dir), 1),
    }
    for name, other in (
        ("tokens_equal", "eager"),
        ("static_compile_tokens_equal", "static-compile"),
    ):
        if other in outputs and other not in errors:
            at = new_tokens_differ_at(outputs["aotc"], outputs[other], args.prompt_tokens)
            record[name] = at is None
            if at is not None:  # low-precision argmax ties on random weights flip tokens
                record.setdefault("first_different_token", {})[other] = at
    for name in args.contenders:
        if name in errors:
            record[name] = {"error": errors[name]}
        elif samples.get(name):
            record[name] = summarize(samples[name], args.new)
    rate = {
        n: record[n]["decode_tokens_per_s"]
        for n in runs
        if "decode_tokens_per_s" in record.get(n, {})
    }
    record["decode_speedup"] = {
        f"vs_{name.replace('-', '_')}": round(rate["aotc"] / rate[name], 2)
        for name in rate
        if name != "aotc"
    }
    record["memory"] = memory
    if args.bandwidth_bytes_per_s:
        # the average decode step attends over prompt + new / 2 positions (steps feed positions
        # prompt .. prompt + new - 2, each reading the cache up to and including its own)
        average_position = args.prompt_tokens + args.new / 2
        per_token = weights + kv_position * average_position
        floor = args.bandwidth_bytes_per_s / per_token
        record["bandwidth_floor"] = {
            "bandwidth_gb_s": round(args.bandwidth_bytes_per_s / 1e9, 1),
            "bytes_per_token_mb": round(per_token / MB, 2),
            "floor_tokens_per_s": round(floor, 1),
            **{f"{n.replace('-', '_')}_fraction": round(r / floor, 3) for n, r in rate.items()},
        }

    # free this model's GPU memory before the next one (its peak must not include ours)
    runs.clear()  # its closures hold the package and the models
    models.clear()
    outputs.clear()
    del package
    gc.collect()
    if "static-compile" in args.contenders:
        torch._dynamo.reset()  # its compiled code and CUDA-graph pools
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--gpt2-124m", action="store_true", help="add GPT2Config() (124M)")
    parser.add_argument("--llama-1b", action="store_true", help="add Llama-3.2-1B's shape")
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
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
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
    if "static-compile" in args.contenders and not cuda:
        parser.error("static-compile is a CUDA contender (reduce-overhead is CUDA graphs)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.new < 2:
        parser.error("--new must be at least 2 (the decode rate is over tokens 2..new)")
    if args.prompt_tokens + args.new > args.max_seq_len:
        parser.error("--prompt-tokens + --new exceed --max-seq-len")

    import torch
    import transformers

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
        ):
            if flag:
                models.append(work / f"{name}.py")
                models[-1].write_text(source)
        for model_file in models:
            artifact, export_s = export(model_file, work, args)
            for precision in args.precision:
                record = measure(model_file, artifact, export_s, precision, args)
                print(json.dumps(record), flush=True)
                records.append(record)
                if args.out:  # after every record: a run cut short keeps what it measured
                    out = {"meta": meta, "records": records}
                    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
