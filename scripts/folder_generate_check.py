"""A saved model folder through aotc, token for token against transformers: `aotc export FOLDER
--task text-generation`, `aotc build`, then the package's greedy generation of a few prompts
beside transformers' own `generate` on `from_pretrained(FOLDER)`, in fp32 on the CPU. Prints the
torch and transformers releases, each prompt's tokens from both, and exits 1 if any differ.

usage: python scripts/folder_generate_check.py FOLDER [--work DIR] [--max-seq-len N] [--new-tokens N]
       (SmolLM2-135M-Instruct's folder: scripts/smollm2_folder.py)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about compilers."}],
)
PLAIN = "The three largest planets of the solar system are"


def aotc(*args) -> float:
    """Run an aotc command (the one beside this Python); its seconds."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "aotc", *map(str, args)]
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def prompt_ids(folder: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    chats = [
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        for messages in PROMPTS
    ]
    texts = [*chats, PLAIN]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--work", type=Path, default=Path("folder_check"))
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=40)
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    import aotc_runtime

    args.work.mkdir(parents=True, exist_ok=True)
    artifact, package = args.work / "model.pt2", args.work / "model_pkg"
    seconds = {
        "export": aotc("export", args.folder, "--task", "text-generation", "--max-seq-len",
                       args.max_seq_len, "--batch-size", 1, "-o", artifact, "--force"),
        "build": aotc("build", artifact, "--device", "cpu", "-o", package, "--force", "--quiet"),
    }  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32).eval()
    loaded = aotc_runtime.load(package)
    rows, equal = [], True
    for ids in prompt_ids(args.folder):
        prompt = torch.tensor([ids])
        with torch.no_grad():
            theirs = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                    max_new_tokens=args.new_tokens, do_sample=False)  # fmt: skip
        ours = loaded.generate(prompt, max_new_tokens=args.new_tokens)
        theirs_new, ours_new = theirs[0, len(ids) :].tolist(), ours[0, len(ids) :].tolist()
        # transformers stops at the first end-of-sequence id; aotc pads the row after it with that id
        ours_new = ours_new[: len(theirs_new)]
        rows.append({"prompt_tokens": len(ids), "transformers": theirs_new, "aotc": ours_new,
                     "equal": theirs_new == ours_new})  # fmt: skip
        equal &= theirs_new == ours_new
    report = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "folder": str(args.folder),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "prompts": rows,
        "equal": equal,
    }
    print(json.dumps(report, indent=1))
    sys.exit(0 if equal else 1)


if __name__ == "__main__":
    main()
