"""`aotc generate`: new tokens from a text-generation package (aotc_runtime's Package.stream),
with the time to the first token and the decode rate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from aotc.cli.keys import required_key, signature_options
from aotc.cli.sampling_options import sampling_options
from aotc.cli.types import exit_codes_epilog, threads_option
from aotc.errors import UserInputError
from aotc_runtime.sampling_settings import MAX_LOGPROBS  # torch-free: --help stays fast


def token_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserInputError(
            f"--prompt-ids {text!r} is not a comma-separated list of token ids (5,17,42)"
        ) from None
    return ids


def utf8_text(text: str) -> str:
    """A --prompt as the tokenizer gets it: bytes that are not UTF-8 reach Python as lone
    surrogates, which no tokenizer encodes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserInputError(
            f"--prompt {text.encode('utf-8', 'replace').decode()[:40]!r} is not valid UTF-8 text; "
            "give UTF-8 (or the ids with --prompt-ids)"
        ) from None
    return text


def chat_prompts(loaded, tokenizer, texts: list) -> list:
    """Each text as one user's message rendered by the package's chat template, as ids."""
    from aotc_runtime.chat_template import ChatTemplate

    template = ChatTemplate.of_package(loaded)
    if template is None:
        raise UserInputError(
            f"--chat needs a chat template, and {loaded.path} carries none; leave --chat out, or "
            "export the model from its folder with its chat template (aotc export MODEL_DIR "
            "--task text-generation)"
        )
    try:
        return [template.prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in texts]
    finally:
        template.close()


@click.command(epilog=exit_codes_epilog())
@click.argument("package", type=click.Path(path_type=Path))
@click.option(
    "--prompt",
    "texts",
    multiple=True,
    help="A prompt as text, with the tokenizer the package carries; repeat for a batch.",
)
@click.option(
    "--prompt-ids",
    "prompts",
    multiple=True,
    help="A prompt as comma-separated token ids (5,17,42); repeat for a batch.",
)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@sampling_options(model_defaults=False)
@click.option(
    "--ignore-eos", is_flag=True, help="Go on past end-of-sequence tokens to --max-new-tokens."
)
@click.option(
    "--logprobs",
    type=click.IntRange(0, MAX_LOGPROBS),
    default=None,
    help="With --json: each new token's log-probability and those of the N most likely tokens "
    "at its step (0 to 20).",
)
@click.option(
    "--stream",
    is_flag=True,
    help="Print the text as it comes (--prompt: one prompt), or each step's ids (--prompt-ids); "
    "with --json, a JSON line per step, then the report.",
)
@click.option(
    "--chat",
    "as_chat",
    is_flag=True,
    help="Render each --prompt as a user's message with the package's chat template (the prompt "
    "`aotc chat` and /v1/chat/completions make of a first turn).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@threads_option(
    "CPU threads of each step (1 to 1024) [default: one per physical core this process may use, "
    "within its CPU affinity and cgroup quota; OMP_NUM_THREADS when set]; in the timings."
)
@signature_options
def generate(
    package,
    texts,
    prompts,
    max_new_tokens,
    sampling,
    ignore_eos,
    logprobs,
    stream,
    as_chat,
    as_json,
    threads,
    require_signature,
    public_key,
):
    """New tokens for each prompt from PACKAGE (built from `aotc export --task text-generation`).

    Prompts of different lengths are left-padded, as transformers pads a batch.
    """
    import aotc_runtime
    from aotc_runtime.generation import left_padded

    if bool(texts) == bool(prompts):
        raise UserInputError(
            "give the prompts as --prompt TEXT or as --prompt-ids 5,17,42 (one of them)"
        )
    if logprobs is not None and not as_json:
        raise UserInputError("--logprobs is printed in the JSON result; add --json")
    if as_chat and not texts:
        raise UserInputError("--chat renders --prompt text as a user's message; give --prompt TEXT")
    public_key = required_key(require_signature, public_key)
    texts = [utf8_text(t) for t in texts]
    from aotc_runtime.threads import set_threads

    threads = set_threads(threads)  # before the package loads: inter-op threads are set once
    loaded = aotc_runtime.load(package, public_key=public_key)
    tokenizer = loaded.tokenizer if texts else None
    if as_chat:
        ids = chat_prompts(loaded, tokenizer, texts)
    elif tokenizer is not None:
        ids = [tokenizer.encode(t).ids for t in texts]
    else:
        ids = [token_ids(p) for p in prompts]
    if any(not prompt for prompt in ids):
        raise UserInputError("a prompt is empty (no tokens); give at least one token")
    if stream and tokenizer is not None and len(ids) > 1 and not as_json:
        raise UserInputError(
            f"--stream prints one prompt's text as it comes, and {len(ids)} prompts were given; "
            "give one --prompt, or add --json for a line per step with every prompt's new text"
        )
    input_ids, mask = left_padded(ids)
    started = time.perf_counter()
    stamps, steps, with_logprobs = [], [], []
    for step in loaded.stream(
        input_ids,
        mask,
        text=stream and tokenizer is not None,  # each step's text, decoded incrementally
        max_new_tokens=max_new_tokens,
        **sampling,
        ignore_eos=ignore_eos,
        logprobs=logprobs,
    ):
        if logprobs is not None:  # a generation.StepLogprobs, or a TextStep holding one
            with_logprobs.append(step.logprobs if hasattr(step, "text") else step)
        stamps.append(time.perf_counter())
        steps.append(getattr(step, "ids", step).tolist())  # a TextStep's ids, or the tensor
        if stream:
            show_step(steps[-1], getattr(step, "text", None), len(steps) - 1, as_json)
    if stream and tokenizer is not None and not as_json:
        click.echo()  # the streamed text's line ends
    generated = [[step[row] for step in steps] for row in range(len(ids))]
    report: dict = {"generated_ids": generated, "timings": timings(started, stamps, threads)}
    if tokenizer is not None:
        report["generated_text"] = [tokenizer.decode(row) for row in generated]
    if logprobs is not None:
        report["logprobs"] = logprobs_report(with_logprobs, len(ids))
    if as_json:
        click.echo(json.dumps(report))
        return
    if not stream:
        for row in report.get("generated_text") or generated:
            click.echo(row if isinstance(row, str) else ",".join(str(t) for t in row))
    t = report["timings"]
    # a generation whose every sequence ended at its first token made no decode step: no rate
    decode = (
        f"{t['decode_tokens_per_s']:.1f} tokens/s per sequence after it (p50 "
        f"{t['decode_p50_ms']:.2f} ms, p99 {t['decode_p99_ms']:.2f} ms)"
        if t["decode_steps"]
        else "no decode step after it (every sequence ended at its first token)"
    )
    click.echo(
        f"first token {t['first_token_ms']:.1f} ms; {decode}; "
        f"{threads} CPU thread{'' if threads == 1 else 's'}",
        err=True,
    )
    from aotc_runtime.timing import gaps_ms, stall_note

    note = stall_note(gaps_ms(stamps), threads)
    if note:
        click.echo(note, err=True)


def show_step(ids: list, text: list | None, number: int, as_json: bool) -> None:
    """--stream: a step as it comes. With --json a JSON line per step, {"step", "token_ids"[,
    "text"]} (one entry per prompt; the last line is the report --json prints without --stream);
    else one prompt's new text as it comes, or the step's ids on a line (--prompt-ids)."""
    if as_json:
        click.echo(
            json.dumps({"step": number, "token_ids": ids, **({"text": text} if text else {})})
        )
    elif text is not None:
        click.echo(text[0], nl=False)  # echo flushes: the text shows as it comes
    else:
        click.echo(" ".join(str(t) for t in ids))


def timings(started: float, stamps: list, threads: int | None = None) -> dict:
    """Time to the first token (the prefill), the decode steps after it, and the CPU threads
    they ran with."""
    from aotc_runtime import summarize
    from aotc_runtime.timing import gaps_ms

    steps = gaps_ms(stamps)
    decode = summarize(steps) if steps else {}
    return {
        "first_token_ms": (stamps[0] - started) * 1e3 if stamps else None,
        "decode_steps": len(steps),
        "decode_tokens_per_s": 1e3 * len(steps) / sum(steps) if steps else 0.0,
        "decode_p50_ms": decode.get("median_ms", 0.0),
        "decode_p99_ms": decode.get("p99_ms", 0.0),
        "threads": threads,
    }


def logprobs_report(steps: list, prompts: int) -> list:
    """Per prompt, one entry per token it made (none after it ended): the token's id and
    log-probability, and the most likely tokens' at its step, most likely first."""
    import math

    report: list = [[] for _ in range(prompts)]
    for step in steps:
        chosen, ids, values = (
            step.logprobs.tolist(),
            step.top_ids.tolist(),
            step.top_logprobs.tolist(),
        )
        for row in range(prompts):
            if math.isnan(chosen[row]):  # the prompt had ended: its token is the pad
                continue
            top = [{"token_id": i, "logprob": v} for i, v in zip(ids[row], values[row])]
            token = int(step.tokens[row])
            report[row].append({"token_id": token, "logprob": chosen[row], "top_logprobs": top})
    return report
