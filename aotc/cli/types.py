"""Command-line value types: syntax is checked at the edge, by the same parsers the library uses."""

from __future__ import annotations

import click

# shared with `aotc-serve`, which runs without aotc: they live beside it in the runtime
from aotc_runtime.serve.cli_options import ThreadsType
from aotc_runtime.serve.cli_options import exit_codes_epilog as exit_codes_epilog


class ParsedType(click.ParamType):
    """A click type that runs `parse(text)` and turns its ValueError into a usage error (exit 2)."""

    def __init__(self, name: str, parse):
        self.name = name
        self._parse = parse

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value  # already converted (defaults, repeated conversion)
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _inductor_option(text: str):
    from aotc.compiler.inductor_options import parse_option

    return parse_option(text)


def shape_type() -> ParsedType:
    from aotc.export.shapes import parse_input_shape

    return ParsedType("[NAME=]SHAPE", parse_input_shape)


def dim_type() -> ParsedType:
    from aotc.export.shapes import parse_dim

    return ParsedType("NAME=MIN:MAX[:EXAMPLE]", parse_dim)


def option_type() -> ParsedType:
    return ParsedType("KEY=VALUE", _inductor_option)


def model_options(command):
    """The flags that say which model and which inputs: shared by `aotc export` and `aotc explain`."""
    from pathlib import Path

    options = [
        click.argument("model"),
        click.option(
            "--input-shape",
            "input_shapes",
            type=shape_type(),
            multiple=True,
            help="Shape of one input: 16x3x128x128 or Bx128 (positional), input_ids=8x128 (keyword); repeat per input.",
        ),
        click.option(
            "--dim",
            "dims",
            type=dim_type(),
            multiple=True,
            help="Range of a named dim: B=1:64 or B=1:64:16 (example size; default 16 clamped into the range); "
            "with example_inputs(), the axes it makes dynamic: B=1:64@input_ids:0,attention_mask:0.",
        ),
        click.option(
            "--dtype",
            "dtypes",
            multiple=True,
            help="Input dtype: one for all or one per input (float32, float16, bfloat16, int64, int32, bool...).",
        ),
        click.option(
            "--entry", help="Name of the model class, factory, instance or function in the file."
        ),
        click.option(
            "--weights",
            type=click.Path(path_type=Path),
            help="state_dict to load first (torch.save file or .safetensors).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def duration_type() -> ParsedType:
    return ParsedType("DURATION", parse_duration)


def specialize_type() -> ParsedType:
    from aotc.compiler.specialize import parse_specialize

    return ParsedType("DIM=SIZE[,SIZE...]", parse_specialize)


def parse_duration(text: str) -> float:
    """'20m' -> 1200.0, '90s' or '90' -> 90.0, '1h' -> 3600.0."""
    units = {"s": 1, "m": 60, "h": 3600}
    raw = text.strip().lower()
    scale = units.get(raw[-1:], None)
    number = raw[:-1] if scale else raw
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"'{text}' is not a duration; give one like 20m, 90s or 1h")
    return value


def threads_option(help_text: str):
    """The --threads flag of `aotc generate`, `aotc bench` and `aotc serve` (None: not given)."""
    return click.option("--threads", type=ThreadsType(), default=None, help=help_text)
