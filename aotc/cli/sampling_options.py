"""The sampling options `aotc generate` and `aotc chat` share: one list, one set of ranges (the
runtime's Sampling checks the values when it is made), reaching the command as one `sampling`
dict keyed by Sampling's field names."""

from __future__ import annotations

import functools
from collections.abc import Callable

import click

# torch-free: --help stays fast
from aotc_runtime.sampling_settings import MAX_SEED, SAMPLING_FIELDS

MODEL_DEFAULT = "[default: the model's, from its generation_config]"


def sampling_options(model_defaults: bool) -> Callable:
    """The options temperature, top-k, top-p, seed, min-p and the three penalties, given to the
    command as `sampling`: {Sampling field: value}. With `model_defaults` an option left out
    takes the package's recorded default (Generation.default_sampling: what
    /v1/chat/completions uses too) and arrives as None; without, greedy and no penalties."""

    def shown(default: float, words: str) -> dict:
        if model_defaults:
            return {"default": None, "help": f"{words} {MODEL_DEFAULT}"}
        return {"default": default, "show_default": True, "help": words}

    options = [
        click.option(
            "--temperature",
            type=click.FloatRange(min=0.0),
            **shown(0.0, "0: greedy; above 0: sampled."),
        ),
        click.option("--top-k", type=click.IntRange(min=1), default=None),
        click.option(
            "--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=None
        ),
        click.option(
            "--seed",
            type=click.IntRange(0, MAX_SEED),
            default=None,
            help="Makes a sampled run repeatable (0 to 2**64-1).",
        ),
        click.option(
            "--min-p",
            type=float,
            default=None,
            help="0 to 1: a sampled token must be at least this times as likely as the most likely.",
        ),
        click.option(
            "--presence-penalty",
            type=float,
            default=0.0,
            show_default=True,
            help="-2 to 2, subtracted from the logit of every token already made (OpenAI's).",
        ),
        click.option(
            "--frequency-penalty",
            type=float,
            default=0.0,
            show_default=True,
            help="-2 to 2, times how often a token was made, subtracted from its logit (OpenAI's).",
        ),
        click.option(
            "--repetition-penalty",
            type=float,
            **shown(
                1.0,
                "0.01 to 100: the logits of tokens in the prompt or made are divided by it "
                "(transformers'; above 1 discourages repeats).",
            ),
        ),
    ]

    def apply(command: Callable) -> Callable:
        @functools.wraps(command)
        def gathered(*args, **kwargs):
            sampling = {name: kwargs.pop(name) for name in SAMPLING_FIELDS}
            return command(*args, sampling=sampling, **kwargs)

        for option in reversed(options):
            gathered = option(gathered)
        return gathered

    return apply


def with_model_defaults(generation, given: dict) -> dict:
    """The sampling settings of `given` (the options, None where left out), the package's
    recorded defaults in place of those left out."""
    defaults = generation.default_sampling()
    return {
        key: getattr(defaults, key) if value is None and hasattr(defaults, key) else value
        for key, value in given.items()
    }
