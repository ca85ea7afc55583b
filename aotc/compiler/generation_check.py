"""The build's numeric check of a text-generation package: what generation depends on.

A generation step returns next-token logits, and generation reads them in two ways: greedy
decoding takes their argmax, sampling their softmax. So the check bounds, per row of logits, the
largest difference from the reference by atol + rtol x the row's standard deviation (the logits'
spread: a softmax is unchanged by a shift and reads differences in units of that spread), and it
asks the greedy token of every row to be the reference's, except where the reference's own top-2
logits are within that same bound (a near tie, which rounding may flip). An element-wise rtol
reads near-zero logits, which no token depends on, and a fixed atol does not grow with the
logits' scale or with a long prefill's longer sums.

Both sides run the check's cases (text_generation.check_cases: the cache's whole length, prompts of
several lengths, decode steps, a mixed step), then a greedy generation from the export's example
prompt: its prefill and GREEDY_STEPS decode steps. Each greedy step feeds both sides the token the
reference chose (vLLM's tests feed each side its own and stop comparing at the first difference;
fed the same tokens, every step compares logits of the same context and a near tie does not end
the comparison). The reference runs first, in this process, and picks the tokens; the package runs
all the cases in one child process, each once, or twice for a package that replays CUDA graphs (a
graph is captured on the first call and replayed on the second). The reference runs each case
once: a step writes the cache positions it reads, so its second call repeats the first exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aotc.errors import NumericMismatchError
from aotc.export.eager_reference import CALLS_PER_CASE, EagerRun

GREEDY_STEPS = 8  # decode steps after the example prompt's prefill, as the cache allows

# inputs of a generation step (aotc_runtime/decode_step.py): the tokens fed, each one's row and
# position, and the tokens whose logits are picked
IDS, ROWS, POSITIONS, PICKS = 0, 1, 2, 3


@dataclass
class Disagreement:
    """One row of one call whose logits or greedy token the bound does not allow."""

    label: str
    row: int
    position: int  # the position in the row's sequence whose token the logits predict
    what: str  # the one-line description of the difference


def greedy_cases(run: EagerRun, prompts: list, max_len: int, device, calls: int) -> tuple:
    """(cases, reference outputs) of a greedy generation from `prompts` (each row's ids): its
    prefill, then up to GREEDY_STEPS decode steps, each fed the reference's argmax of the step
    before. Each case's outputs are listed `calls` times, as the child runs it."""
    from aotc_runtime.decode_step import pack

    batch, length = len(prompts), max(len(p) for p in prompts)
    picks = None if batch >= 3 else batch
    cases, outputs = [], []
    feeds = [(row, 0, list(prompt)) for row, prompt in enumerate(prompts)]
    steps = min(GREEDY_STEPS, max_len - length)
    for step in range(steps + 1):
        label = (
            f"greedy prefill of the example prompt ({length} tokens)"
            if step == 0
            else f"greedy decode step {step} after the example prompt"
        )
        inputs = [t.to(device) for t in pack(feeds, picks)]
        cases.append((label, inputs))
        outputs += reference_calls(run, label, inputs, calls)
        chosen = outputs[-1][0].argmax(-1).tolist()
        feeds = [(row, held + len(fed), [chosen[row]]) for row, held, fed in feeds]
    return cases, outputs


def reference_calls(run: EagerRun, label: str, inputs: list, calls: int) -> list:
    """The reference's outputs of a case for each of the child's `calls` calls of it: one eager
    call, repeated (a generation step rewrites the cache positions it reads with the same values,
    so a second call returns the first's outputs and leaves the same cache)."""
    return [run.call(label, inputs)] * calls


def calls_per_case(package_dir: Path) -> int:
    """How often the child calls each case: twice for a package that replays CUDA graphs (the
    capture, then a replay), else once. A generation step's second call repeats its first
    exactly (above)."""
    import json

    manifest = json.loads((package_dir / "manifest.json").read_text())
    return CALLS_PER_CASE if manifest.get("runtime", {}).get("cuda_graphs") else 1


def example_prompt(ep, task: dict) -> list:
    """Each row's prompt the model was exported with (its first example call), else seeded random
    ids of the same length."""
    import torch

    examples = getattr(ep, "example_inputs", None)
    if examples and len(examples[0]) == 4 and examples[0][0].dim() == 1:
        ids, rows = examples[0][IDS].cpu(), examples[0][ROWS].cpu()
        prompts = [ids[rows == row].tolist() for row in range(task["batch_size"])]
        if all(prompts):
            return prompts
    length = max(2, min(8, task["max_seq_len"] // 2))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, task["vocab_size"], (task["batch_size"], length), generator=g)
    return ids.tolist()


def compare_step(label: str, inputs: list, got, want, atol: float, rtol: float) -> tuple:
    """(largest |difference|, largest |difference| / the row's spread, [Disagreement]) of one call's
    logits [B, vocab]: the logits bound first, then the greedy token."""
    import torch

    got64, want64 = got.to(torch.float64), want.to(torch.float64)
    if got64.shape != want64.shape:
        what = f"logits of shape {list(got.shape)} where eager gives {list(want.shape)}"
        return float("inf"), float("inf"), [Disagreement(label, 0, 0, what)]
    spread = want64.std(-1)
    bound = atol + rtol * spread
    diff = (got64 - want64).abs().amax(-1)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    relative = diff / spread.clamp_min(torch.finfo(torch.float64).tiny)
    chosen, wanted = got64.argmax(-1), want64.argmax(-1)
    # the position each picked token's logits predict, and its row
    picked = inputs[PICKS].cpu()
    predicted = (inputs[POSITIONS].cpu()[picked] + 1).tolist()
    rows = inputs[ROWS].cpu()[picked].tolist()
    problems = []
    for pick in range(want64.shape[0]):
        row, position = rows[pick], predicted[pick]
        gap = float(want64[pick, wanted[pick]] - want64[pick, chosen[pick]])
        if chosen[pick] != wanted[pick] and not gap <= float(bound[pick]):
            problems.append(
                Disagreement(
                    label,
                    row,
                    position,
                    f"greedy token {int(chosen[pick])} where eager's is {int(wanted[pick])}, whose "
                    f"logit leads by {gap:.3g} ({gap / float(spread[pick]):.2g} of the logits' "
                    "spread: not a near tie)",
                )
            )
        elif not diff[pick] <= bound[pick]:
            problems.append(
                Disagreement(
                    label,
                    row,
                    position,
                    f"logits differ from eager by {float(diff[pick]):.3g} "
                    f"({float(relative[pick]):.2g} of the logits' spread {float(spread[pick]):.3g})",
                )
            )
    return float(diff.max()), float(relative.max()), problems


def check_generation(
    ep, signature, package_dir: Path, device: str, settings: dict, task: dict, run_in_child
):
    """The check of a generation package; returns the manifest's NumericCheck record or raises
    NumericMismatchError naming the first disagreement (the call, row, position and what).
    `settings`: atol, rtol, allow_mismatch, strict, precision, described (the reference's words)."""
    import contextlib

    from aotc.export.text_generation import check_cases
    from aotc.math_mode import strict_fp32
    from aotc_runtime import NumericCheck, OutputCheck

    atol, rtol, strict = settings["atol"], settings["rtol"], settings["strict"]
    cases = check_cases(task, device)
    per_case = calls_per_case(package_dir)
    with strict_fp32() if strict else contextlib.nullcontext():
        run = EagerRun(ep, signature, device)
        references = [out for label, t in cases for out in reference_calls(run, label, t, per_case)]
        greedy, greedy_references = greedy_cases(
            run, example_prompt(ep, task), task["max_seq_len"], device, per_case
        )
    cases, references = cases + greedy, references + greedy_references
    outputs = run_in_child(package_dir, cases, strict, per_case)
    calls = [(label, t, call) for label, t in cases for call in ("first", "repeat")[:per_case]]
    worst_abs, worst_rel, worst_case, problems, near_ties = 0.0, 0.0, calls[0][0], [], 0
    for (label, inputs, call), got, want in zip(calls, outputs, references):
        where = f"{label}, {call} call"
        max_abs, max_rel, found = compare_step(where, inputs, got[0], want[0], atol, rtol)
        near_ties += int((got[0].argmax(-1) != want[0].argmax(-1)).sum()) - sum(
            "greedy token" in p.what for p in found
        )
        problems += found
        if max_rel >= worst_rel:
            worst_abs, worst_rel, worst_case = max_abs, max_rel, where
    name = signature["outputs"][0]["name"] if signature["outputs"] else "logits"
    greedy_calls = len(greedy) * per_case * task["batch_size"]
    described = (
        f"{settings['described']}; per row of logits |package - eager| <= atol + rtol x the "
        f"row's std, and greedy tokens equal except near ties ({near_ties} near ties in "
        f"{len(calls) * task['batch_size']} rows, {greedy_calls} of them a greedy generation "
        "from the example prompt)"
    )
    record = NumericCheck(
        reference=described + (", TF32 off on both sides" if strict else ""),
        cases=tuple(label for label, _ in cases),
        atol=atol,
        rtol=rtol,
        outputs=(OutputCheck(name, worst_abs, worst_rel, atol, rtol, not problems, worst_case),),
        passed=not problems,
    )
    if problems and not settings["allow_mismatch"]:
        first = problems[0]
        raise NumericMismatchError(
            f"the package's {first.what} at {first.label}, row {first.row}, predicting position "
            f"{first.position}; bound atol={atol:g} + rtol={rtol:g} x spread for "
            f"{settings['precision']}; {settings['fix']}"
        )
    return record


def mismatch_fix(precision: str, model_dtype: str) -> str:
    """What to do when a generation package that computes in `precision` fails its check; the
    model was exported with weights in `model_dtype` (fp32, or bf16/fp16 for a model in half)."""
    if model_dtype != "fp32":  # any --precision computes in the model's own half type
        higher = f"export the model in fp32 (its weights are {model_dtype}), "
    elif precision != "fp32":
        higher = "build at a higher --precision (fp32), "
    else:
        higher = ""
    return (
        f"{higher}loosen --rtol (a fraction of the logits' spread), or pass --allow-mismatch to "
        "keep the package anyway"
    )
