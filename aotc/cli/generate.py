"""`aotc generate`: new tokens from a text-generation package (aotc_runtime's Package.stream),
with the time to the first token and the decode rate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from aotc.cli.keys import required_key, signature_options
from aotc.cli.types import exit_codes_epilog
from aotc.errors import UserInputError

MAX_SEED = 2**64 - 1  # aotc_runtime.sampling.MAX_SEED, without importing torch for --help


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
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="0: greedy; above 0: sampled.",
)
@click.option("--top-k", type=click.IntRange(min=1), default=None)
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=None)
@click.option(
    "--seed",
    type=click.IntRange(0, MAX_SEED),
    default=None,
    help="Makes a sampled run repeatable (0 to 2**64-1).",
)
@click.option("--stream", is_flag=True, help="Print each step's new tokens as they come.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@signature_options
def generate(
    package,
    texts,
    prompts,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    seed,
    stream,
    as_json,
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
    public_key = required_key(require_signature, public_key)
    texts = [utf8_text(t) for t in texts]
    loaded = aotc_runtime.load(package, public_key=public_key)
    tokenizer = loaded.tokenizer if texts else None
    ids = [tokenizer.encode(t).ids for t in texts] if tokenizer else [token_ids(p) for p in prompts]
    if any(not prompt for prompt in ids):
        raise UserInputError("a prompt is empty (no tokens); give at least one token")
    input_ids, mask = left_padded(ids)
    started = time.perf_counter()
    stamps, steps = [], []
    for tokens in loaded.stream(
        input_ids,
        mask,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
    ):
        stamps.append(time.perf_counter())
        steps.append(tokens.tolist())
        if stream and not as_json:
            click.echo(" ".join(str(t) for t in steps[-1]))
    generated = [[step[row] for step in steps] for row in range(len(ids))]
    report: dict = {"generated_ids": generated, "timings": timings(started, stamps)}
    if tokenizer is not None:
        report["generated_text"] = [tokenizer.decode(row) for row in generated]
    if as_json:
        click.echo(json.dumps(report))
        return
    if not stream:
        for row in report.get("generated_text") or generated:
            click.echo(row if isinstance(row, str) else ",".join(str(t) for t in row))
    t = report["timings"]
    click.echo(
        f"first token {t['first_token_ms']:.1f} ms; {t['decode_tokens_per_s']:.1f} tokens/s per "
        f"sequence after it (p50 {t['decode_p50_ms']:.2f} ms, p99 {t['decode_p99_ms']:.2f} ms)",
        err=True,
    )


def timings(started: float, stamps: list) -> dict:
    """Time to the first token (the prefill), and the decode steps after it."""
    from aotc_runtime import summarize

    steps = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
    decode = summarize(steps) if steps else {}
    return {
        "first_token_ms": (stamps[0] - started) * 1e3 if stamps else None,
        "decode_steps": len(steps),
        "decode_tokens_per_s": 1e3 * len(steps) / sum(steps) if steps else 0.0,
        "decode_p50_ms": decode.get("median_ms", 0.0),
        "decode_p99_ms": decode.get("p99_ms", 0.0),
    }
