"""The `aotc` command line: parse flags, build a config, call one aotc.api function, print the result.

Heavy imports (torch) happen inside commands so `aotc --help` stays fast.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import click

from .errors import INTERRUPTED_EXIT_CODE, AotcError, AotcRuntimeError
from .quiet import VERBOSE_ENV
from .cli_types import exit_codes_epilog, model_options, option_type


class AotcGroup(click.Group):
    """click.Group whose main() maps errors to the exit-code table (also under CliRunner)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        code = run_reporting_errors(
            lambda: super(AotcGroup, self).main(args, prog_name, complete_var, standalone_mode=False, **extra),
            verbose="--verbose" in args,
        )
        sys.exit(code)


@click.group(cls=AotcGroup, epilog=exit_codes_epilog(), context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="aotc", prog_name="aotc")
@click.option("--verbose", is_flag=True, help="Show torch's logs and full tracebacks.")
def cli(verbose):
    """aotc: export a PyTorch model, compile it ahead of time, run it with no compile and no warm-up.

    \b
      aotc export model.py --input-shape 32x128 -o model.pt2
      aotc build model.pt2 --mode max-autotune   (-> model_pkg/, on the GPU when there is one)
      aotc run model_pkg/ --iters 100
    """
    # Set or cleared on every invocation: one --verbose must not leak into the next in-process call.
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    else:
        os.environ.pop(VERBOSE_ENV, None)


@cli.command(epilog=exit_codes_epilog())
@model_options
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Artifact path [default: <model>.pt2].")
@click.option("--strict", is_flag=True, help="Use torch.export's strict (TorchDynamo) tracing.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def export(model, output, input_shapes, dims, dtypes, entry, weights, strict, force, as_json):
    """Trace MODEL (a .py file or package.module:attr) into an export artifact (.pt2)."""
    from .api import export as export_api
    from .config import ExportConfig

    if output is None:
        output = Path(Path(model.split(":")[-1]).stem + ".pt2")
    cfg = ExportConfig(model=model, output=output, input_shapes=tuple(input_shapes), dims=tuple(dims), dtypes=tuple(dtypes),
                       entry=entry, weights=weights, strict=strict, force=force)
    result = export_api(cfg)
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
    for spec in result.signature.get("state", ()):
        click.echo(f"  state  {spec['name']}: {spec['dtype']} {spec['shape']} (forward updates it; the package keeps it between calls)")
    for name, value in result.signature.get("constants", {}).items():
        click.echo(f"  const  {name} = {value!r} (baked into the program)")
    for name in result.signature.get("dropped_outputs", ()):
        click.echo(f"note: output {name} is None on the example inputs; it is left out of the package's outputs", err=True)


@cli.command(epilog=exit_codes_epilog())
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Package folder to write [default: <artifact>_pkg/ beside the artifact].")
@click.option("--mode", type=click.Choice(["default", "reduce-overhead", "max-autotune"]), default=None, help="Mode preset (configs/modes/) [default: default].")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None, help="Target device; auto: cuda if torch sees a GPU, else cpu [default: auto].")
@click.option("--precision", type=click.Choice(["fp32", "tf32", "bf16", "fp16"]), default=None, help="Compute precision [default: fp32].")
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="YAML with build settings (flags override it).")
@click.option("--option", "options", type=option_type(), multiple=True, help="Inductor option over the preset, e.g. freezing=false; repeatable.")
@click.option("--atol", type=float, help="Absolute tolerance of the numeric check [default per precision].")
@click.option("--rtol", type=float, help="Relative tolerance of the numeric check [default per precision].")
@click.option("--allow-mismatch", is_flag=True, default=None, help="Keep the package even if the numeric check fails.")
@click.option("--no-bsymbolic", is_flag=True, help="Do not link the model .so with -Wl,-Bsymbolic (see README).")
@click.option("--force", is_flag=True, help="Replace an existing package.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def build(artifact, output, mode, device, precision, config_file, options, atol, rtol, allow_mismatch, no_bsymbolic, force, as_json, quiet):
    """Compile ARTIFACT ahead of time into a package folder (AOTInductor + manifest.json)."""
    from .api import build as build_api
    from .config import BuildConfig, Mode, Precision, apply_config_file, default_package_folder
    from .progress import Progress

    if output is None:
        output = default_package_folder(artifact)
    flags = {"mode": mode, "device": device, "precision": precision, "atol": atol, "rtol": rtol, "allow_mismatch": allow_mismatch}
    given = {key for key, value in flags.items() if value is not None}
    cfg = BuildConfig(artifact=artifact, output=output, options=dict(options), force=force, bsymbolic=not no_bsymbolic,
                      mode=Mode(mode or "default"), device=device or "auto", precision=Precision(precision or "fp32"),
                      atol=atol, rtol=rtol, allow_mismatch=bool(allow_mismatch))
    if config_file:
        cfg = apply_config_file(cfg, config_file, given)
    result = build_api(cfg, Progress(enabled=not quiet))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    m = result.manifest
    target = m["device"]["type"] if m["device"].get("requested") != "auto" else f"auto -> {m['device']['type']}"
    click.echo(f"built {result.output} ({m['mode']}, {target}, {m['precision']}) in {m['build_seconds']:.1f}s, {m['size_bytes'] / 1e6:.1f} MB")
    check = m["numeric_check"]
    for out in check["outputs"]:
        status = "ok" if out["ok"] else "MISMATCH"
        click.echo(f"  check {out['name']}: max abs {out['max_abs']:.3g}, max rel {out['max_rel']:.3g} (atol {out['atol']:g}, rtol {out['rtol']:g}) {status}")
    click.echo(f"run it: aotc run {shlex.quote(str(result.output) + '/')}")


@cli.command(epilog=exit_codes_epilog())
@click.argument("package", type=click.Path(path_type=Path))
@click.option("--input", "inputs", multiple=True, type=click.Path(path_type=Path), help=".npy, .npz or .pt in positional order; default: seeded random inputs.")
@click.option("--output", type=click.Path(path_type=Path), help="Write outputs to .npz (output_0, ...) or .pt.")
@click.option("--iters", type=click.IntRange(min=0), default=0, help="Timed calls after the first (median/p90/p99).")
@click.option("--seed", type=int, default=0, help="Seed of the random inputs.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def run(package, inputs, output, iters, seed, as_json):
    """Run PACKAGE through the thin runtime: no compile, no warm-up."""
    from aotc_runtime.runner import format_report, run_package

    report = run_package(package, inputs, output, iters, seed)
    click.echo(json.dumps(report, indent=2) if as_json else format_report(report))


from .cli_bench import bench as _bench; cli.add_command(_bench)  # noqa: E402,E702


from .cli_explain import explain as _explain; cli.add_command(_explain)  # noqa: E402,E702


def run_reporting_errors(invoke, verbose: bool) -> int:
    """Run a CLI invocation; turn every failure into a one-line error and a documented exit code."""
    try:
        invoke()
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted; nothing was written", err=True)
        return INTERRUPTED_EXIT_CODE
    except (AotcError, AotcRuntimeError) as exc:
        if verbose:
            raise
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:  # our own bug: say so, briefly
        if verbose:
            raise
        click.echo(f"error: internal error in aotc: {type(exc).__name__}: {exc}; rerun with --verbose and report it", err=True)
        return 1


def main(argv=None) -> int:
    """Console entry point (`aotc`, `python -m aotc`)."""
    cli.main(args=argv, prog_name="aotc")


if __name__ == "__main__":
    main()
