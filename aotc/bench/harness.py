"""`aotc bench`: a package against eager and torch.compile of the artifact it was built from.

All contenders run in one process on the same inputs, interleaved: each round runs a slice of
every contender's timed calls in turn (the order rotates), so machine drift (clock boost, a noisy
neighbour, thermal throttling) hits all of them alike. Timing is runtime/aotc_runtime/timing.py:
CUDA events on GPU, perf_counter on CPU. Cold starts run in fresh processes (aotc/bench/cold.py);
the table and JSON are aotc/bench/report.py, the plot aotc/bench/plot.py; what is asked,
aotc/bench/options.py. A text-generation package is timed per token instead
(aotc/bench/generation_bench.py).
"""

from __future__ import annotations

import functools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aotc.bench.options import BenchConfig, CallCounts, parse_against
from aotc.errors import AotcError, AotcRuntimeError, BuildError, ModelError, UserInputError
from aotc.export.user_frames import first_line
from aotc.math_mode import tf32_matmuls
from aotc.quiet import quiet_torch

if TYPE_CHECKING:
    import torch

    from aotc_runtime import Manifest, Signature

REPORT_VERSION = 1
COMPILE_WEIGHT = 20  # a torch.compile first call weighs ~20 timed slices on the progress bar


@dataclass
class Contender:
    name: str  # "package", "eager", "compile:default", "cpp"
    kind: str  # package | eager | compile | cpp
    mode: str | None
    call: object = None
    setup_ms: float = 0.0
    native: object = None  # cpp: the RunnerProcess that makes and times its calls


def contender_names(cfg: BenchConfig, manifest: Manifest) -> tuple:
    """The package first, then the baselines (default: eager, compile:default, compile at the package's mode)."""
    against = (
        cfg.against_text()
        if cfg.against is not None
        else f"eager,compile:default,compile:{manifest.mode}"
    )
    return ("package",) + parse_against(against)


def bench_package(cfg: BenchConfig, bar=None) -> dict:
    """Measure the package and its baselines; return the report (JSON-ready dict). A
    text-generation package goes to aotc/bench/generation_bench.py."""
    cfg.validate()
    import torch

    from aotc.bench.cold import cold_start_plan, fresh_compile_cache, measure_cold_starts
    from aotc.bench.machine import machine_description
    from aotc.progress import ProgressBar
    from aotc_runtime import read_manifest

    manifest = read_manifest(Path(cfg.package))
    if manifest.generation is not None:
        from aotc.bench.generation_bench import bench_generation

        return bench_generation(cfg, manifest, bar)
    counts = cfg.for_one_call()
    names = contender_names(cfg, manifest)
    signature = manifest.signature
    batch_sizes = resolve_batch_sizes(signature, cfg.batch_sizes)
    baselines = [
        n for n in names if n in ("eager", "onnxruntime") or n.startswith("compile:")
    ]  # what needs the artifact
    artifact = resolve_artifact(cfg, manifest) if baselines else None
    device = bench_device(cfg, manifest)
    if "onnxruntime" in names and device.type != "cpu":
        raise UserInputError(
            "--against onnxruntime is a CPU baseline (this onnxruntime has no CUDA); bench a CPU package"
        )
    rounds = min(cfg.rounds, counts.iters)
    cold_plan = cold_start_plan(names, counts.cold_runs) if counts.cold_start else []
    bar = bar or ProgressBar(enabled=False)
    compiles = sum(name.startswith("compile:") for name in names)
    bar.begin(
        len(names)
        + len(batch_sizes) * (len(names) * (1 + rounds) + compiles * COMPILE_WEIGHT)
        + sum(case.weight for _run, case in cold_plan)
    )
    work = tempfile.TemporaryDirectory(prefix="aotc-bench-")
    others = {}
    if "onnxruntime" in names:
        bar.note("building the ONNX Runtime package of the artifact")
        others["onnxruntime"] = onnxruntime_package(artifact, Path(work.name))
    with (
        work,
        fresh_compile_cache(),
        tf32_matmuls(manifest.precision == "tf32"),
    ):  # baselines of a tf32 package use TF32 too
        ep = None
        if artifact is not None:
            bar.note(f"loading {artifact}")
            ep = place_baseline(artifact, manifest, device)
        with torch.inference_mode():
            contenders = []
            try:
                for name in names:
                    bar.step(f"loading {name}")
                    contenders.append(
                        setup_contender(name, ep, Path(others.get(name, cfg.package)))
                    )
                rows = [
                    row
                    for batch in batch_sizes
                    for row in measure_batch(contenders, signature, batch, cfg, counts, device, bar)
                ]
            finally:
                for contender in contenders:
                    if contender.native is not None:
                        contender.native.close()
        cold = (
            measure_cold_starts(cold_plan, Path(cfg.package), artifact, manifest, bar, others)
            if cold_plan
            else None
        )
    bar.finish()
    return {
        "report_version": REPORT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "package": package_summary(cfg.package, manifest),
        "artifact": str(artifact) if artifact else None,
        "machine": machine_description(device),
        "settings": {
            "iters": counts.iters,
            "warmup": counts.warmup,
            "rounds": rounds,
            "batch_sizes": list(batch_sizes),
            "example_batch_size": batch_axis(signature)[1],
            "seed": cfg.seed,
            "timer": "cuda-events" if device.type == "cuda" else "perf_counter",
            "memory": "cuda-allocator-peak" if device.type == "cuda" else "rss-growth",
            "cold_start": counts.cold_start,
            "cold_runs": counts.cold_runs if counts.cold_start else 0,
        },
        "contenders": [
            {"name": c.name, "kind": c.kind, "mode": c.mode, "setup_ms": c.setup_ms}
            for c in contenders
        ],
        "results": rows,
        "cold_start": cold,
    }


def bench_device(cfg: BenchConfig, manifest: Manifest) -> torch.device:
    """The torch.device the package runs on here; a UserInputError if this machine has none."""
    import torch

    device = torch.device("cuda", 0) if manifest.device.type == "cuda" else torch.device("cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError(
            f"package {cfg.package} is a CUDA package but this machine has no usable GPU; bench it on a GPU machine"
        )
    return device


def package_summary(package: Path, manifest: Manifest) -> dict:
    """The report's "package": what was benched, as its manifest says."""
    return {
        "path": str(package),
        "model": manifest.model,
        "device": manifest.device.to_json(),
        "mode": manifest.mode,
        "precision": manifest.precision,
        "build_seconds": manifest.build_seconds,
        "size_bytes": manifest.size_bytes,
        "backend": manifest.backend,
        "tuning": tuning_summary(manifest),
    }


def tuning_summary(manifest: Manifest) -> str | None:
    """'dynamic: onnxruntime; B=8: freezing' for a tuned or specialized package, else None."""
    if not manifest.tuning:
        return None
    return "; ".join(
        f"{variant.get('label', '')}: {variant['chosen']}"
        for variant in manifest.tuning.get("variants", [])
    )


def measure_batch(
    contenders: list,
    signature: Signature,
    batch: int,
    cfg: BenchConfig,
    counts: CallCounts,
    device,
    bar,
) -> list:
    """First call, warm-up and interleaved timed calls of every contender at one batch size."""
    from aotc_runtime import summarize

    axis, _example = batch_axis(signature)
    sizes = {axis: batch} if isinstance(axis, str) else {}
    inputs = signature.random_inputs(seed=cfg.seed, sizes=sizes, device=device)
    firsts = {}
    for contender in contenders:
        compiles = " (compiling)" if contender.kind == "compile" else ""
        bar.step(
            f"batch {batch}: first call and warm-up of {contender.name}{compiles}",
            1 + COMPILE_WEIGHT * bool(compiles),
        )
        firsts[contender.name] = first_call_and_warmup(contender, inputs, counts.warmup, device)
    samples = interleaved(
        contenders, inputs, counts.iters, cfg.rounds, device, bar, f"batch {batch}"
    )
    latency = {name: summarize(times) for name, times in samples.items()}
    package_median = latency["package"]["median_ms"]
    return [
        {
            "contender": c.name,
            "batch_size": batch,
            **firsts[c.name],
            "latency": latency[c.name],
            "throughput_items_per_s": batch * 1e3 / latency[c.name]["median_ms"]
            if latency[c.name]["median_ms"] > 0
            else None,
            # > 1: the package is that many times faster than this contender (medians).
            "package_speedup": latency[c.name]["median_ms"] / package_median
            if package_median > 0
            else None,
            **({"ran": model_that_runs(c, inputs)} if c.kind == "package" else {}),
        }
        for c in contenders
    ]


def model_that_runs(contender: Contender, inputs) -> str:
    """Which model of the package these inputs run: "." (its own) or a --specialize member's folder."""
    target = contender.call.route(*inputs)
    return Path(target.path).relative_to(contender.call.path).as_posix()


def resolve_artifact(cfg: BenchConfig, manifest: Manifest) -> Path:
    """The .pt2 the package was built from (or --artifact), checked against the manifest's sha256."""
    from aotc_runtime import sha256_file

    source = manifest.source
    if cfg.artifact is not None:
        path = Path(cfg.artifact)
    elif source is not None:
        path = Path(source.artifact)
        if not path.is_file():
            raise UserInputError(
                f"{path}, the artifact package {cfg.package} was built from, is gone; pass --artifact "
                "PATH to a copy of it"
            )
    else:
        raise UserInputError(
            f"package {cfg.package} does not say which artifact it was built from; pass --artifact MODEL.pt2"
        )
    if source is not None and sha256_file(path) != source.sha256:
        raise UserInputError(
            f"{path} is not the artifact package {cfg.package} was built from (sha256 differs); "
            "pass --artifact with that .pt2, or rebuild the package from this one"
        )
    return path


def batch_axis(signature: Signature):
    """(dim name or static size or None, example size) of the first axis of the first input."""
    inputs = signature.inputs
    if not inputs or not inputs[0].shape:
        return None, 1
    first = inputs[0].shape[0]
    if isinstance(first, str):
        return first, signature.dims[first]["example"]
    return first, first


def resolve_batch_sizes(signature: Signature, requested: tuple) -> tuple:
    axis, example = batch_axis(signature)
    if not requested:
        return (example,)
    if isinstance(axis, str):
        low, high = signature.dims[axis]["min"], signature.dims[axis]["max"]
        outside = [b for b in requested if not low <= b <= high]
        if outside:
            raise UserInputError(
                f"--batch-sizes {','.join(map(str, outside))}: the package's batch dim {axis} ranges {low}..{high}; "
                f"re-export with a wider --dim {axis}=MIN:MAX or choose sizes in that range"
            )
        return tuple(requested)
    if any(b != example for b in requested):
        name = signature.inputs[0].name if signature.inputs else "the input"
        raise UserInputError(
            f"--batch-sizes {','.join(map(str, requested))}: the first axis of {name} is static "
            f"({axis}) in this package; "
            f"re-export with a named dim (--input-shape Bx... --dim B=MIN:MAX) or leave --batch-sizes out"
        )
    return tuple(requested)


def setup_contender(name: str, ep, package_path: Path) -> Contender:
    """Load one contender and time it (the artifact is loaded once for all baselines)."""
    import torch

    kind, _, mode = name.partition(":")
    contender = Contender(name, kind, mode or None)
    started = time.perf_counter()
    if kind in ("package", "onnxruntime"):  # onnxruntime: the artifact's ONNX Runtime package
        import aotc_runtime

        contender.call = aotc_runtime.load(package_path)
    elif kind == "cpp":
        from aotc.bench.native import RunnerProcess

        contender.native = RunnerProcess(package_path)
    else:
        module = ep.module()
        # dynamic=False: torch.compile specializes every batch size it is timed at, its fastest
        # kernels (with the default, the second size recompiles for any size, and every later size
        # runs those generic kernels), as a --specialize package does for its sizes.
        contender.call = (
            module if kind == "eager" else torch.compile(module, mode=mode, dynamic=False)
        )
    contender.setup_ms = (time.perf_counter() - started) * 1e3
    return contender


def onnxruntime_package(artifact: Path, work: Path) -> Path:
    """The artifact built with --backend onnxruntime (numeric check included) into `work`."""
    from aotc.build.backends import backend
    from aotc.config import BuildConfig
    from aotc.progress import Progress

    cfg = BuildConfig(
        artifact=artifact, output=work / "onnxruntime_pkg", device="cpu", backend="onnxruntime"
    )
    return backend("onnxruntime").build(cfg, Progress(enabled=False), time.perf_counter()).output


def place_baseline(artifact: Path, manifest: Manifest, device):
    """The ExportedProgram on the package's device and precision, so baselines compute alike."""
    from aotc.config import Precision
    from aotc.export.artifact import load_artifact
    from aotc.export.placement import place_program

    ep, _meta = load_artifact(artifact)
    with quiet_torch():
        return place_program(
            ep, device.type, Precision(manifest.precision), manifest.signature.to_json()
        )


def first_call_and_warmup(contender: Contender, inputs, warmup: int, device) -> dict:
    """The first call at this batch size (compilation for torch.compile), then untimed warm-up calls."""
    from aotc.bench.memory import MemoryWatch
    from aotc_runtime import synchronize

    if contender.native is not None:  # the C++ runner, in its own process: no memory figure here
        first_ms = contender.native.use_inputs(inputs)
        contender.native.time(0, warmup)
        return {"first_call_ms": first_ms, "memory_mb": None}
    with MemoryWatch(device) as memory:
        started = time.perf_counter()
        try:
            with quiet_torch():
                contender.call(*inputs)
                synchronize(device)
        except (AotcError, AotcRuntimeError):
            raise
        except Exception as exc:
            raise _contender_error(contender, exc) from exc
        first_ms = (time.perf_counter() - started) * 1e3
        for _ in range(warmup):
            contender.call(*inputs)
        synchronize(device)
    return {"first_call_ms": first_ms, "memory_mb": memory.peak_mb}


def _contender_error(contender: Contender, exc: Exception) -> Exception:
    text = f"{type(exc).__name__}: {first_line(exc)[:300]}"
    if contender.kind == "compile":
        return BuildError(
            f"torch.compile(mode={contender.mode!r}) failed on the artifact: {text}; leave "
            f"{contender.name} out of --against"
        )
    if contender.kind == "eager":
        return ModelError(
            f"the artifact fails when run eagerly: {text}; re-export it with `aotc export`"
        )
    return BuildError(
        f"the package fails on its own signature's inputs: {text}; rebuild it with `aotc build --force`"
    )


def interleaved(contenders: list, inputs, iters: int, rounds: int, device, bar, label: str) -> dict:
    """Timed calls of every contender, split into rounds; each round runs one slice of each in turn."""
    from aotc_runtime import time_calls

    rounds = min(rounds, iters)
    samples = {c.name: [] for c in contenders}
    for index in range(rounds):
        count = iters // rounds + (1 if index < iters % rounds else 0)
        shift = index % len(contenders)  # rotate so no contender always runs right after another
        for contender in contenders[shift:] + contenders[:shift]:
            bar.step(f"{label}: timed round {index + 1}/{rounds}: {contender.name}")
            # One untimed call per slice: the switch between contenders costs each of them alike.
            if contender.native is not None:
                samples[contender.name] += contender.native.time(count, 1)
                continue
            samples[contender.name] += time_calls(
                functools.partial(contender.call, *inputs), count, device, warmup=1
            )
    return samples
