"""What `aotc bench` (and `aotc build --tune`) time side by side: each contender loaded, its first
call and warm-up, then the interleaved timed rounds of all of them (see harness.py for why
interleaved). A contender is the package, the C++ runner on it, eager or torch.compile of the
artifact placed as the package is, or the artifact's ONNX Runtime package."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aotc.bench.options import BenchConfig, parse_against
from aotc.errors import AotcError, AotcRuntimeError, BuildError, ModelError
from aotc.export.user_frames import first_line
from aotc.quiet import quiet_torch

if TYPE_CHECKING:
    from aotc_runtime import Manifest


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


def model_that_runs(contender: Contender, inputs) -> str:
    """Which model of the package these inputs run: "." (its own) or a --specialize member's folder."""
    target = contender.call.route(*inputs)
    return Path(target.path).relative_to(contender.call.path).as_posix()


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
    from aotc.compiler.backends import backend
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
