"""What int4 GPTQ costs a real model, measured eagerly: SmolLM2-135M-Instruct's linears replaced
by their dequantized int4 weights (aotc's `gptq_levels`, the grids in bf16 as the packages store
them), perplexity over several windows of the evaluation text of scripts/quantization_accuracy.py.

A package's accuracy row (quantization_accuracy.py) reads one window of 512 tokens; this probe
reads --windows of them, to show how much one window's figure moves with the luck of a few
near-ties, and tries two variants that a package cannot be built with:
  one-pass     every layer's Hessian gathered from the float model in one pass (what
               `--quantize-method gptq` does)
  sequential   each block's Hessians gathered after the blocks before it were quantized (the
               paper's layer-by-layer order); --sequential turns it on (about 8 minutes on 2 cores)
Each row also gives the first window through bf16 products (activations and outputs rounded, as
torch's CPU int4 kernel computes) and with the logits alone rounded to bf16.

    python scripts/smollm2_folder.py /tmp/smollm2
    python scripts/gptq_eager_probe.py --folder /tmp/smollm2 --windows 8 --sequential
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantization_accuracy import evaluation_text  # noqa: E402

from aotc.export.gptq import CALIBRATION_TOKENS, calibration_chunks, gptq_levels  # noqa: E402
from aotc.export.quantized_linear import int4_groups, int4_groups_dequantized  # noqa: E402


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the block being calibrated has run."""


def hessians(model, modules: dict, chunks: list, stop_after=None) -> dict:
    """name -> X^T X (float64) of each module's input over the calibration chunks."""
    sums = {
        n: torch.zeros(m.in_features, m.in_features, dtype=torch.float64)
        for n, m in modules.items()
    }

    def gather(name):
        def hook(module, inputs, output):
            x = inputs[0].reshape(-1, inputs[0].shape[-1]).double()
            sums[name] += x.T @ x

        return hook

    def stop(module, inputs, output):
        raise _Stop

    hooks = [m.register_forward_hook(gather(n)) for n, m in modules.items()]
    if stop_after is not None:
        hooks.append(stop_after.register_forward_hook(stop))
    with torch.no_grad():
        for chunk in chunks:
            try:
                model(torch.tensor([chunk]))
            except _Stop:
                pass
    for hook in hooks:
        hook.remove()
    return sums


def quantize(modules: dict, sums: dict, group: int) -> None:
    """Each module's weight replaced by its GPTQ int4 levels, dequantized."""
    for name, module in modules.items():
        w = module.weight.detach().float()
        levels = gptq_levels(w, sums[name].float(), group, torch.bfloat16)
        packed, scale_zero = int4_groups(w, group, torch.bfloat16, levels)
        module.weight.data.copy_(int4_groups_dequantized(packed, scale_zero, group))


def negative_log_likelihoods(model, windows: list) -> list:
    out = []
    with torch.no_grad():
        for window in windows:
            logits = model(torch.tensor([window])).logits[0, :-1].double()
            logprobs = torch.log_softmax(logits, -1)
            out.append(-logprobs.gather(1, torch.tensor(window[1:])[:, None])[:, 0])
    return out


def increase(nll, base) -> float:
    return 100 * (math.exp(float(nll.mean())) / math.exp(float(base.mean())) - 1)


def report(name: str, model, windows: list, base: list) -> None:
    got = negative_log_likelihoods(model, windows)
    each = " ".join(f"{increase(g, b):+.2f}" for g, b in zip(got, base))
    print(f"{name}: {increase(torch.cat(got), torch.cat(base)):+.2f}% over all; windows {each}")
    plain = torch.nn.Linear.forward

    def bf16_product(self, x):  # torch's CPU int4 kernel: bf16 activations in, a bf16 product out
        return (x.bfloat16().float() @ self.weight.T).bfloat16().float().to(x.dtype)

    torch.nn.Linear.forward = bf16_product
    try:
        rounded = negative_log_likelihoods(model, windows[:1])[0]
    finally:
        torch.nn.Linear.forward = plain
    with torch.no_grad():
        logits = model(torch.tensor([windows[0]])).logits[0, :-1].bfloat16().double()
    tail = torch.tensor(windows[0][1:])[:, None]
    logits_only = -torch.log_softmax(logits, -1).gather(1, tail)[:, 0]
    print(
        f"  first window: fp32 {increase(got[0], base[0]):+.2f}%, bf16 products "
        f"{increase(rounded, base[0]):+.2f}%, logits alone in bf16 {increase(logits_only, base[0]):+.2f}%"
    )


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--folder", type=Path, required=True, help="scripts/smollm2_folder.py's output"
    )
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per window")
    parser.add_argument("--group", type=int, default=64)
    parser.add_argument("--sequential", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32).eval()
    # untied: the output layer is quantized as a product, the embedding stays as it is
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    ids = tokenizer(evaluation_text())["input_ids"][: args.windows * args.tokens]
    windows = [ids[i : i + args.tokens] for i in range(0, len(ids), args.tokens)]
    chunks = calibration_chunks(
        (args.folder / "tokenizer.json").read_text(), CALIBRATION_TOKENS, 512
    )
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    original = {n: m.weight.detach().clone() for n, m in linears.items()}
    base = negative_log_likelihoods(model, windows)
    print(f"float: perplexity {math.exp(float(torch.cat(base).mean())):.3f} over {len(ids)} tokens")

    started = time.monotonic()
    quantize(linears, hessians(model, linears, chunks), args.group)
    print(f"one-pass GPTQ took {time.monotonic() - started:.0f} s")
    report("one-pass GPTQ", model, windows, base)
    if args.sequential:
        for name, module in linears.items():
            module.weight.data.copy_(original[name])
        started = time.monotonic()
        for index, block in enumerate(model.model.layers):
            inside = {
                f"{index}.{n}": m
                for n, m in block.named_modules()
                if isinstance(m, torch.nn.Linear)
            }
            quantize(inside, hessians(model, inside, chunks, stop_after=block), args.group)
        head = {"lm_head": model.lm_head}
        quantize(head, hessians(model, head, chunks), args.group)
        print(f"sequential GPTQ took {time.monotonic() - started:.0f} s")
        report("sequential GPTQ", model, windows, base)


if __name__ == "__main__":
    main()
