"""`aotc bench`: the click command. It parses flags into a BenchConfig, calls aotc.api.bench, prints the table.

Registered on the `aotc` group in aotc/cli/main.py; torch and matplotlib are imported inside the command.
matplotlib is optional (`aotc[bench]`): --plot checks for it first, before minutes of measuring.

The flags of one kind of package only are None when not given, so the library, which reads the
package, can tell what was asked for: a text-generation package refuses --iters, --batch-sizes,
--cold-start, --cold-runs, --plot and the one-call baselines in one line when given (exit 2),
and takes --no-cold-start as it is (it has no cold start to skip); a one-call package refuses
--prompt-tokens, --new-tokens and --against static-compile. --warmup's default differs by kind.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from aotc.bench.options import parse_against, parse_batch_sizes
from aotc.cli.types import ParsedType, exit_codes_epilog, threads_option


@click.command(epilog=exit_codes_epilog())
@click.argument("package", type=click.Path(path_type=Path))
@click.option(
    "--against",
    type=ParsedType("LIST", parse_against),
    default=None,
    help="Baselines, comma-separated: eager, compile:default, compile:reduce-overhead, compile:max-autotune, "
    "onnxruntime, cpp, or none [default: eager, compile:default and compile at the package's mode]; "
    "a text-generation package: eager, static-compile, gpt-fast (the Llama family), or none "
    "[default: eager and static-compile].",
)
@click.option(
    "--artifact",
    type=click.Path(path_type=Path),
    help="The .pt2 the package was built from [default: the one its manifest names].",
)
@click.option(
    "--iters",
    type=click.IntRange(min=1),
    default=None,
    help="Timed calls per contender and batch size [default: 100].",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=None,
    help="Untimed calls after the first, per contender and batch size [default: 10]; "
    "a text-generation package: untimed generations per contender [default: 1].",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Interleaved rounds the timed calls are split into (text generation: one generation "
    "per contender a round).",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Text generation: the prompt's length in tokens [default: 32, at most half the "
    "package's cache].",
)
@click.option(
    "--new-tokens",
    type=click.IntRange(min=2),
    default=None,
    help="Text generation: tokens generated per run [default: 64, at most what the cache holds "
    "after the prompt].",
)
@click.option(
    "--batch-sizes",
    type=ParsedType("N,N,...", parse_batch_sizes),
    default=None,
    help="Batch sizes to measure, e.g. 1,8,16 (needs a dynamic first dim) [default: the exported one].",
)
@click.option(
    "--cold-start/--no-cold-start",
    default=None,
    help="Also time fresh processes from start to first output [default: on].",
)
@click.option(
    "--cold-runs",
    type=click.IntRange(min=1),
    default=None,
    help="Fresh processes per cold-start case [default: 3].",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    help="Write the report as JSON to this file ('-': print it instead of the table).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(path_type=Path),
    help="Write the plot (.png, .svg or .pdf).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@threads_option(
    "CPU threads of every contender, cold starts and the C++ runner included (1 to 1024) "
    "[default: one per physical core this process may use, within its CPU affinity and cgroup "
    "quota; OMP_NUM_THREADS when set]; in the report's machine line."
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar on stderr.")
def bench(
    package,
    against,
    artifact,
    iters,
    warmup,
    rounds,
    prompt_tokens,
    new_tokens,
    batch_sizes,
    cold_start,
    cold_runs,
    json_path,
    plot_path,
    seed,
    threads,
    quiet,
):
    """Time PACKAGE against eager and torch.compile of the artifact it was built from.

    \b
    Steady-state latency (median, p90, p99, min, stdev), throughput, memory and the first call,
    measured interleaved in one process; cold start (process start -> first output) in fresh processes.
      aotc bench pkg/ --against eager,compile:max-autotune --batch-sizes 1,8,16 --json bench.json --plot bench.png
    \b
    A text-generation package: time to first token, decode tokens/s and p50/p99 per token against
    transformers' generate (eager; static cache + torch.compile) on the model it was exported from.
      aotc bench lm_pkg/ --prompt-tokens 32 --new-tokens 64 --json bench.json
    """
    from aotc.optional import require

    if plot_path is not None:
        require("matplotlib", "bench", "--plot")
    from aotc.api import bench as bench_api
    from aotc.bench.options import BenchConfig
    from aotc.bench.report import format_table
    from aotc.progress import ProgressBar

    cfg = BenchConfig(
        package=package,
        against=against,
        artifact=artifact,
        iters=iters,
        warmup=warmup,
        rounds=rounds,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        batch_sizes=batch_sizes or (),
        cold_start=cold_start,
        cold_runs=cold_runs,
        json_path=json_path,
        plot_path=plot_path,
        seed=seed,
        threads=threads,
    )
    report = bench_api(cfg, ProgressBar(enabled=not quiet))
    if json_path is not None and str(json_path) == "-":
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(format_table(report))
    for label, path in (("json", json_path), ("plot", plot_path)):
        if path is not None:
            click.echo(f"wrote {label} {path}")
