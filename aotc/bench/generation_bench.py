"""`aotc bench` on a text-generation package: its options, transformers' model, the report.

The measuring is aotc/bench/generation.py; the table aotc/bench/report.py. The baselines are
transformers' `generate` on the model the package's artifact was exported from: the manifest names
the artifact (checked by its sha256; `--artifact` for a moved copy), the artifact's metadata the
model file, which is loaded as `aotc export` loads it (seed 0 before get_model(), so random weights
are the package's), in the package's precision on its device.

Options: --against takes eager, static-compile (default both) and gpt-fast, --prompt-tokens and
--new-tokens (default 32 and 64, or what the package's cache holds: the prompt at most half of
it, the new tokens the rest), --rounds, --warmup (untimed generations per contender, default 1),
--seed (the prompt's ids), --json, --artifact. A one-call package's options (--iters,
--batch-sizes, --cold-start, --cold-runs, --plot, --against compile:MODE, cpp, onnxruntime) are
refused in one line when given; --no-cold-start is accepted (there is no cold start to skip).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotc.bench.generation import (
    BASELINES,
    COMPILE_WARMUP,
    DEFAULT_BASELINES,
    MAY_FAIL,
    PACKAGE,
    GenerationBench,
    measure,
)
from aotc.bench.options import BenchConfig, parse_against
from aotc.bench.report import REPORT_VERSION, package_summary
from aotc.bench.target import bench_device, resolve_artifact
from aotc.errors import UserInputError
from aotc.math_mode import tf32_matmuls

if TYPE_CHECKING:
    from aotc_runtime import Manifest

TASK = "text-generation"
PROMPT_TOKENS, NEW_TOKENS = 32, 64  # defaults, when the package's cache holds them
WARMUP = 1


def bench_generation(cfg: BenchConfig, manifest: Manifest, bar: Any = None) -> dict:
    """Time a text-generation package against transformers' `generate`; the report (JSON-ready)."""
    from aotc.bench.machine import machine_description
    from aotc.progress import ProgressBar

    if manifest.generation is None:  # bench_package sends only text-generation packages here
        raise UserInputError(
            f"{cfg.package} is not a text-generation package; bench it with bench_package"
        )
    against = generation_against(cfg)
    prompt, new = token_counts(cfg, manifest.generation.max_seq_len)
    device = bench_device(cfg, manifest)
    artifact = resolve_artifact(cfg, manifest) if against else None
    model = model_source(artifact) if artifact is not None else None
    warmup = WARMUP if cfg.warmup is None else cfg.warmup
    spec = GenerationBench(
        package=Path(cfg.package),
        model=model,
        artifact=artifact,
        against=against,
        device=device.type,
        precision=manifest.precision,
        prompt_tokens=prompt,
        new_tokens=new,
        rounds=cfg.rounds,
        warmup=warmup,
        seed=cfg.seed,
    )
    bar = bar or ProgressBar(enabled=False)
    contenders = (PACKAGE, *against)
    compiles = COMPILE_WARMUP * len(set(MAY_FAIL) & set(against))
    bar.begin(len(contenders) * (1 + warmup + cfg.rounds) + compiles)
    with tf32_matmuls(manifest.precision == "tf32"):  # a tf32 package's baselines use TF32 too
        measured = measure(spec, bar)
    bar.finish()
    return {
        "report_version": REPORT_VERSION,
        "task": TASK,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "package": package_summary(cfg.package, manifest),
        "artifact": str(artifact) if artifact else None,
        "baseline_model": ":".join(filter(None, model)) if model else None,
        "machine": machine_description(device),
        "settings": {
            "prompt_tokens": prompt,
            "new_tokens": new,
            "prompts": 1,
            "decoding": "greedy, no end-of-sequence token",
            "warmup": warmup,
            "rounds": cfg.rounds,
            "seed": cfg.seed,
            "timer": "perf_counter at each token's arrival on the host",
            "transformers": transformers_version() if against else None,
        },
        "contenders": list(contenders),
        **measured,
    }


def generation_against(cfg: BenchConfig) -> tuple:
    """The baselines (default: eager and static-compile; gpt-fast when asked for); refuses every
    one-call option given, all in one line."""
    against = DEFAULT_BASELINES if cfg.against is None else parse_against(cfg.against_text())
    given = [f"--against {name}" for name in against if name not in BASELINES]
    given += [
        flag
        for flag, value in (
            ("--iters", cfg.iters is not None),
            ("--batch-sizes", bool(cfg.batch_sizes)),
            ("--cold-start", bool(cfg.cold_start)),
            ("--cold-runs", cfg.cold_runs is not None),
            ("--plot", cfg.plot_path is not None),
        )
        if value
    ]
    if given:
        raise UserInputError(
            f"{', '.join(given)}: not for a text-generation package ({cfg.package}), which is "
            f"timed per generated token against {' and '.join(BASELINES)} (--against, "
            "--prompt-tokens, --new-tokens, --rounds, --warmup); leave "
            f"{'it' if len(given) == 1 else 'them'} out"
        )
    return against


def token_counts(cfg: BenchConfig, cache: int) -> tuple[int, int]:
    """(prompt tokens, new tokens): as given, else the defaults a cache of `cache` positions holds."""
    prompt = cfg.prompt_tokens or min(PROMPT_TOKENS, cache // 2)
    new = cfg.new_tokens or min(NEW_TOKENS, cache - prompt)
    if new < 2 or prompt + new > cache:
        raise UserInputError(
            f"--prompt-tokens {prompt} and --new-tokens {new} need {max(prompt + new, prompt + 2)} "
            f"positions, more than the package's KV cache holds ({cache}, its --max-seq-len); "
            "ask for fewer or re-export the model with a larger --max-seq-len"
        )
    return prompt, new


def model_source(artifact: Path) -> tuple:
    """load_model's (target, entry) of the model `artifact` was exported from; a UserInputError
    if its file is not there."""
    from aotc.export.artifact import read_artifact_meta

    described = read_artifact_meta(artifact).model
    if not described:
        raise UserInputError(
            f"{artifact} does not name the model it was exported from; re-export it with "
            "`aotc export` and rebuild the package, or bench the package alone with --against none"
        )
    target, _, entry = described.rpartition(":")
    if not target.endswith(".py"):  # an import path, package.module:attr
        return described, None
    if not Path(target).is_file():
        relative = "" if Path(target).is_absolute() else " (relative to where `aotc export` ran)"
        raise UserInputError(
            f"{target}{relative}, the model file {artifact} was exported from, is gone; the "
            "baselines are made from it: put it back, or bench the package alone with --against none"
        )
    return target, entry.removesuffix("()")


def transformers_version() -> str:
    import transformers

    return transformers.__version__
