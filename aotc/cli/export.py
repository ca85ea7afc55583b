"""`aotc export`: a model file or a saved model folder -> an export artifact (.pt2); prints the
signature it recorded."""

from __future__ import annotations

import json
from pathlib import Path

import click

from aotc.cli.types import exit_codes_epilog, model_options


@click.command(epilog=exit_codes_epilog())
@model_options
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Artifact path [default: <model>.pt2].",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["pt2", "onnx"]),
    default=None,
    help="pt2: the artifact `aotc build` compiles; onnx: an ONNX model (needs aotc[onnx]); MODEL may "
    "then be a .pt2 artifact to convert [default: from -o's suffix, else pt2].",
)
@click.option(
    "--task",
    type=click.Choice(["text-generation"]),
    default=None,
    help="text-generation: MODEL is a transformers *ForCausalLM, exported as one step of generation "
    "over a static KV cache (prefill and decode); the task makes the inputs itself, and --dtype "
    "(float32, bfloat16, float16) is the model's dtype [default: a folder's config, else the "
    "model's own].",
)
@click.option(
    "--max-seq-len",
    type=int,
    default=None,
    help="With --task: the KV cache's length, prompt and new tokens together.",
)
@click.option(
    "--batch-size",
    type=int,
    default=None,
    help="With --task: the sequences generated at once, the rows `aotc serve` runs together "
    "(fewer may be given at run time). Default: 8, halved until the KV cache fits 1 GiB.",
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path),
    default=None,
    help="With --task: a transformers tokenizer folder (its tokenizer.json, chat template and "
    "special tokens), carried into the package so `aotc generate --prompt TEXT` works offline "
    "[default: a model folder's own].",
)
@click.option("--strict", is_flag=True, help="Use torch.export's strict (TorchDynamo) tracing.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def export(
    model,
    output,
    input_shapes,
    dims,
    dtypes,
    entry,
    weights,
    output_format,
    task,
    max_seq_len,
    batch_size,
    tokenizer,
    strict,
    force,
    as_json,
    quiet,
):
    """Trace MODEL into an export artifact (.pt2), or an ONNX model.

    MODEL is a .py file, package.module:attr, or a folder save_pretrained wrote (config.json,
    *.safetensors, tokenizer files): built with transformers' classes, weights read from
    safetensors, no code from the folder run.

    \b
    aotc export model.py --input-shape Bx3x128x128 --dim B=1:64 -o model.pt2
    aotc export tiny-llama/ --task text-generation --max-seq-len 512 -o lm.pt2
    """
    from aotc.api import export as export_api
    from aotc.config import ExportConfig
    from aotc.progress import Progress

    if output_format is None:
        output_format = "onnx" if output is not None and output.suffix == ".onnx" else "pt2"
    if output is None:
        # a model folder is named by its own name, also when given as `.`
        source = Path(model).resolve() if Path(model).is_dir() else Path(model.split(":")[-1])
        output = Path(source.stem + "." + output_format)
    if model.endswith(".pt2"):
        if output_format != "onnx":
            raise click.UsageError(f"{model} is already an artifact; convert it with --format onnx")
        from aotc.api import export_onnx

        result = export_onnx(Path(model), output, force)
        click.echo(f"converted {model} -> {result.output} in {result.seconds:.1f}s")
        report_onnx_check(result.output)
        return
    cfg = ExportConfig(
        model=model,
        output=output,
        input_shapes=tuple(input_shapes),
        dims=tuple(dims),
        dtypes=tuple(dtypes),
        entry=entry,
        weights=weights,
        strict=strict,
        force=force,
        format=output_format,
        task=task,
        max_seq_len=max_seq_len,
        batch_size=batch_size,
        tokenizer=tokenizer,
    )
    progress = Progress(enabled=not quiet)
    try:
        result = export_api(cfg, progress)
    finally:
        progress.end()
    if output_format == "onnx" and not as_json:
        report_onnx_check(result.output)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(f"exported {result.model} -> {result.output} in {result.seconds:.1f}s")
    for spec in result.signature["inputs"]:
        click.echo(f"  input  {spec['name']}: {spec['dtype']} {spec['shape']}")
    for spec in result.signature["outputs"]:
        click.echo(f"  output {spec['name']}: {spec['dtype']} {spec['shape']}")
    for name, info in result.signature["dims"].items():
        click.echo(f"  dim    {name}: {info['min']}..{info['max']} (example {info['example']})")
    for line in state_lines(result.signature.get("state", ()), task is not None):
        click.echo(line)
    for name, value in result.signature.get("constants", {}).items():
        click.echo(f"  const  {name} = {value!r} (baked into the program)")
    for name in result.signature.get("dropped_outputs", ()):
        click.echo(
            f"note: output {name} is None on the example inputs; it is left out of the package's outputs",
            err=True,
        )
    for note in result.notes:
        click.echo(f"note: {note}", err=True)


def state_lines(state, generation: bool) -> list[str]:
    """One line per state tensor, or for a generation step one line for its whole KV cache
    (two tensors per layer: 60 lines for a 30-layer model otherwise)."""
    keep = "forward updates it; the package keeps it between calls"
    if not generation or not state:
        return [f"  state  {s['name']}: {s['dtype']} {s['shape']} ({keep})" for s in state]
    import math

    itemsize = {"float32": 4, "float64": 8}.get(state[0]["dtype"], 2)
    total = sum(math.prod(s["shape"]) for s in state) * itemsize
    shapes = sorted({str(s["shape"]) for s in state})
    return [
        f"  state  KV cache: {len(state) // 2} layers of keys and values, {state[0]['dtype']} "
        f"{' or '.join(shapes)} each, {_size(total)} ({keep})"
    ]


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def report_onnx_check(path: Path) -> None:
    """The ONNX model against eager, as measured at export; a warning where a build would fail."""
    from aotc.export.onnx import read_onnx_model

    _model, info = read_onnx_model(path)
    for name, max_abs in info.export_check.items():
        click.echo(f"  onnx   {name}: max abs {max_abs:.3g} from eager (ONNX Runtime, unoptimized)")
    worst = max(info.export_check.items(), key=lambda item: item[1], default=None)
    if worst and worst[1] > 1e-4:
        click.echo(
            f"warning: the ONNX model's output '{worst[0]}' differs from eager by {worst[1]:.3g}, "
            "above the build's fp32 tolerance (1e-4): the exporter translates some operation "
            "differently (docs/models.md: attention rows with every key masked); `aotc build "
            "--backend onnxruntime` will fail its check unless --allow-mismatch; AOTInductor has "
            "no such gap",
            err=True,
        )
