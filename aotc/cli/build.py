"""`aotc build`: an export artifact -> a package folder; prints the numeric check."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from aotc.cli.types import duration_type, exit_codes_epilog, option_type, specialize_type
from aotc.compiler.backends import BACKENDS


@click.command(epilog=exit_codes_epilog())
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Package folder to write [default: <artifact>_pkg/ beside the artifact].",
)
@click.option(
    "--mode",
    type=click.Choice(["default", "reduce-overhead", "max-autotune"]),
    default=None,
    help="Mode preset (configs/modes/) [default: default].",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default=None,
    help="Target device; auto: cuda if torch sees a GPU, else cpu [default: auto].",
)
@click.option(
    "--precision",
    type=click.Choice(["fp32", "tf32", "bf16", "fp16"]),
    default=None,
    help="Compute precision [default: fp32].",
)
@click.option(
    "--quantize",
    type=click.Choice(["int8-weight-only", "int4-weight-only", "fp8", "int8-dynamic"]),
    default=None,
    help="Store the linear layers' weights quantized: int8 or int4 weight-only (CPU, CUDA), fp8 "
    "weight-only (CUDA, compute capability 8.9+), int8 weights and activations (CPU) "
    "[default: none].",
)
@click.option(
    "--group-size",
    type=int,
    default=None,
    help="int4-weight-only: input features per scale, one of 32, 64, 128, 256 [default: 128].",
)
@click.option(
    "--quantize-method",
    type=click.Choice(["rtn", "gptq"]),
    default=None,
    help="int4-weight-only, text generation: how the levels are chosen: rtn rounds each weight; "
    "gptq calibrates them on text that ships with aotc, with the artifact's tokenizer "
    "(slower to build, closer to the float model) [default: rtn].",
)
@click.option(
    "--quantize-skip",
    default=None,
    metavar="NAMES",
    help="Keep the layers whose names contain one of these, comma-separated, in the base "
    "precision, e.g. lm_head,embed.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    help="YAML with build settings (flags override it).",
)
@click.option(
    "--option",
    "options",
    type=option_type(),
    multiple=True,
    help="Inductor option over the preset, e.g. freezing=false; repeatable.",
)
@click.option(
    "--atol", type=float, help="Absolute tolerance of the numeric check [default per precision]."
)
@click.option(
    "--rtol", type=float, help="Relative tolerance of the numeric check [default per precision]."
)
@click.option(
    "--allow-mismatch",
    is_flag=True,
    default=None,
    help="Keep the package even if the numeric check fails.",
)
@click.option(
    "--no-bsymbolic",
    is_flag=True,
    help="Do not link the model .so with -Wl,-Bsymbolic (see docs/build-internals.md).",
)
@click.option(
    "--fused-products",
    is_flag=True,
    help="CUDA text generation, experimental: at decode, each product takes its norm, activation "
    "and residual add into one of aotc's kernels (faster at small shapes; docs/benchmarks.md).",
)
@click.option(
    "--pdl",
    is_flag=True,
    help="CUDA, compute capability 9.0+, experimental: launch aotc's kernels with programmatic "
    "dependent launch, each starting while the one before it ends (docs/benchmarks.md).",
)
@click.option(
    "--cpu-isa",
    type=click.Choice(["native", "avx2", "avx512"]),
    default=None,
    help="CPU instruction set of the compiled C++: native (this machine's) or a portable x86-64 "
    "level; the runtime refuses a CPU that lacks it [default: native].",
)
@click.option(
    "--backend",
    type=click.Choice(list(BACKENDS)),
    default=None,
    help="What compiles and runs the model: AOTInductor, or ONNX Runtime (CPU; needs aotc[onnx]); "
    "an .onnx ARTIFACT implies onnxruntime [default: aotinductor].",
)
@click.option(
    "--cudnn-benchmark",
    is_flag=True,
    help="CUDA: the runtime lets cuDNN time its convolution algorithms at the first call per input "
    "shape and keep the fastest (torch.backends.cudnn.benchmark), around this package's calls only.",
)
@click.option(
    "--tune",
    is_flag=True,
    help="Build the candidates of configs/tune/<device>.yaml (Inductor options, ONNX Runtime), check "
    "each, time them side by side and keep the fastest; the manifest records the search.",
)
@click.option(
    "--tune-budget",
    type=duration_type(),
    default=None,
    help="Wall-clock limit of the search, e.g. 20m; the best so far is kept [default: none].",
)
@click.option(
    "--tune-jobs",
    type=int,
    default=None,
    help="Candidate builds run at once (each uses several cores) [default: 1].",
)
@click.option(
    "--tune-candidates",
    default=None,
    metavar="NAMES",
    help="Only these candidates of configs/tune/<device>.yaml, comma-separated, e.g. "
    "inductor,onnxruntime [default: all].",
)
@click.option(
    "--specialize",
    type=specialize_type(),
    default=None,
    help="Also build a static-shape model for each size of a dynamic dim, e.g. B=1,8,16; calls "
    "at those sizes run them, other sizes the dynamic model.",
)
@click.option("--force", is_flag=True, help="Replace an existing package.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def build(
    artifact,
    output,
    mode,
    device,
    precision,
    quantize,
    group_size,
    quantize_method,
    quantize_skip,
    config_file,
    options,
    atol,
    rtol,
    allow_mismatch,
    no_bsymbolic,
    fused_products,
    pdl,
    cpu_isa,
    backend,
    cudnn_benchmark,
    tune,
    tune_budget,
    tune_jobs,
    tune_candidates,
    specialize,
    force,
    as_json,
    quiet,
):
    """Compile ARTIFACT ahead of time into a package folder (AOTInductor + manifest.json)."""
    from aotc.api import build as build_api
    from aotc.config import BuildConfig, Mode, Precision, apply_config_file, default_package_folder
    from aotc.progress import Progress

    if output is None:
        output = default_package_folder(artifact)
    flags = {
        "mode": mode,
        "device": device,
        "precision": precision,
        "atol": atol,
        "rtol": rtol,
        "allow_mismatch": allow_mismatch,
        "cpu_isa": cpu_isa,
        "backend": backend,
        "quantize": quantize,
        "group_size": group_size,
        "quantize_method": quantize_method,
    }
    given = {key for key, value in flags.items() if value is not None}
    cfg = BuildConfig(
        artifact=artifact,
        output=output,
        options=dict(options),
        force=force,
        bsymbolic=not no_bsymbolic,
        fused_products=fused_products,
        pdl=pdl,
        mode=Mode(mode or "default"),
        device=device or "auto",
        precision=Precision(precision or "fp32"),
        atol=atol,
        rtol=rtol,
        allow_mismatch=bool(allow_mismatch),
        cpu_isa=cpu_isa or "native",
        backend=backend or ("onnxruntime" if Path(artifact).suffix == ".onnx" else "aotinductor"),
        cudnn_benchmark=cudnn_benchmark,
        tune=tune,
        tune_budget_s=tune_budget,
        tune_jobs=1 if tune_jobs is None else tune_jobs,
        tune_candidates=tuple(n.strip() for n in tune_candidates.split(",") if n.strip())
        if tune_candidates
        else (),
        specialize=specialize or (),
        quantize=quantize,
        group_size=group_size,
        quantize_method=quantize_method,
        quantize_skip=tuple(n.strip() for n in quantize_skip.split(",") if n.strip())
        if quantize_skip
        else (),
    )
    if config_file:
        cfg = apply_config_file(cfg, config_file, given)
    progress = Progress(enabled=not quiet)
    try:
        result = build_api(cfg, progress)
    finally:
        progress.end()
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    m = result.manifest
    target = m.device.type if m.device.requested != "auto" else f"auto -> {m.device.type}"
    scheme = f", {m.quantization['scheme']}" if m.quantization else ""
    click.echo(
        f"built {result.output} ({m.mode}, {target}, {m.precision}{scheme}) in "
        f"{m.build_seconds:.1f}s, {(m.size_bytes or 0) / 1e6:.1f} MB"
    )
    if m.quantization:
        click.echo(quantization_line(m.quantization))
    for out in m.numeric_check.outputs if m.numeric_check else ():
        status = "ok" if out.ok else "MISMATCH"
        click.echo(
            f"  check {out.name}: max abs {out.max_abs:.3g}, max rel {out.max_rel:.3g} (atol "
            f"{out.atol:g}, rtol {out.rtol:g}) {status}"
        )
    breakdown = time_breakdown(m.build_phases)
    if breakdown:
        click.echo(f"  time: {breakdown}")
    if m.tuning:
        click.echo(tuning_table(m.tuning))
    click.echo(next_command(result.output, m))


def next_command(output, manifest) -> str:
    """The line after a build: the command that runs what was built. A text-generation package
    chats (with a chat template) or generates (from text with a tokenizer, else from ids)."""
    package = shlex.quote(str(output) + "/")
    generation = manifest.generation
    if generation is None:
        return f"run it: aotc run {package}"
    if getattr(generation, "chat_template", None):
        return f"chat with it: aotc chat {package}"
    if generation.tokenizer:
        return f"generate with it: aotc generate {package} --prompt 'Once upon a time'"
    return f"generate with it: aotc generate {package} --prompt-ids 5,17,42"


def time_breakdown(phases: dict) -> str:
    """'load 7.1s, lower 0.3s, compile 21.6s (C++ compiler 12.7s), check 3.2s' from build_phases,
    and Inductor's vector-ISA probe where it ran (the first build on a machine)."""
    from aotc.compiler.finish import STAGE_PREFIX

    def seconds(key: str) -> float | None:
        entry = phases.get(key)
        return entry.get("seconds") if isinstance(entry, dict) else None

    parts = []
    for stage in ("load", "lower", "compile", "check"):
        value = seconds(STAGE_PREFIX + stage)
        if value is None:
            continue
        part = f"{stage} {value:.1f}s"
        compiler = seconds("compile_file")  # Inductor's C++ compiler runs
        if stage == "compile" and compiler:
            part += f" (C++ compiler {compiler:.1f}s)"
        parts.append(part)
    probe = phases.get(STAGE_PREFIX + "cpu_isa_probe")
    if isinstance(probe, dict) and probe.get("calls"):
        parts.append(
            f"CPU ISA probe {probe['seconds']:.1f}s ({probe['calls']} runs, once per machine)"
        )
    return ", ".join(parts)


def tuning_table(tuning: dict) -> str:
    """The search, one line per candidate and model: what it cost, what it measured, what became of it."""
    cached = tuning["builds_from_cache"]
    lines = [
        f"  search: {tuning['builds']} build(s) ({cached} from the cache) in {tuning['search_seconds']:.1f}s"
        + (", cut short by --tune-budget" if tuning["cut_by_budget"] else "")
    ]
    for variant in tuning["variants"]:
        label = variant.get("label", "")
        for c in variant["candidates"]:
            median = f"{c['median_ms']:.3f} ms" if c.get("median_ms") is not None else "-"
            built = f"{c['build_seconds']:.0f}s" if c.get("build_seconds") is not None else "-"
            why = f" ({c['reason']})" if c.get("reason") else ""
            lines.append(
                f"  {label:>10} {c['name']:<26} build {built:>5}  median {median:>11}  {c['status']}{why}"
            )
    lines += [f"  left out {line}" for line in tuning.get("dropped", [])]
    return "\n".join(lines)


def quantization_line(record: dict) -> str:
    """One line on what --quantize did: layers quantized and kept, the worst layer's error."""
    worst = record.get("worst_layer") or {}
    kept = record.get("kept") or []
    line = f"  quantized {len(record.get('layers') or [])} layers"
    if worst:
        line += (
            f", worst error {worst['error']:.3g} ({worst['name']}; bound {record['error_bound']})"
        )
    if kept:
        line += (
            f"; kept {len(kept)} in the base precision: "
            + ", ".join(k["name"] for k in kept[:4])
            + (" ..." if len(kept) > 4 else "")
        )
    return line
