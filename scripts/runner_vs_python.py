"""A package through the C++ runner, the Python runtime and torch.compile, side by side in one run.

    python scripts/runner_vs_python.py PKG/ [--runs 5] [--iters 200] [--rounds 4] [--batch-sizes 1,16] [--json out.json]

Cold start: fresh processes, alternated run by run, timed from the spawn to the first line of
output (the report each runtime prints after its first call): `aotc-runner PKG` (its own --json
says where its time went: manifest, hashes, loader), `python -m aotc_runtime PKG`, and bare
`python -c "import torch"` (+ CUDA init for a CUDA package). Steady state per batch size: the
runner's --iters in a subprocess, and in this process the Python runtime and torch.compile
(reduce-overhead on CUDA, default on CPU) of the artifact the package was built from, all on the
same inputs, split into rounds that alternate. CUDA times are CUDA events; the runner also
reports host time per call (the CPU's share of a call). Medians and percentiles; no assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy
import torch

import aotc_runtime
from aotc.deploy.cpp_runner import runner_path


def first_line_ms(command: list) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    elapsed = (time.perf_counter() - started) * 1e3
    rest = proc.stdout.read()  # not communicate(): it would skip what readline() buffered
    errors = proc.stderr.read()
    proc.wait()
    if proc.returncode != 0 or not line:
        raise SystemExit(f"{' '.join(command)} failed: {errors.strip()[-500:]}")
    return elapsed, line + rest


def cold_starts(package: Path, runner: Path, runs: int, cuda: bool) -> dict:
    bare = "import torch" + ("; torch.zeros(1, device='cuda')" if cuda else "")
    commands = {
        "cpp runner": [str(runner), str(package), "--json"],
        "python runtime": [sys.executable, "-m", "aotc_runtime", str(package)],
        f'python -c "{bare}"': [sys.executable, "-c", bare + "; print('ready')"],
    }
    times = {name: [] for name in commands}
    breakdown = []
    for _run in range(runs):
        for name, command in commands.items():
            elapsed, output = first_line_ms(command)
            times[name].append(elapsed)
            if name == "cpp runner":
                report = json.loads(output)
                breakdown.append(
                    {
                        "load": report["load_breakdown_ms"],
                        "first_call_ms": report["first_call_ms"],
                        "to_first_output_ms": report["process_to_first_output_ms"],
                    }
                )
    summary = {
        name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
        for name, t in times.items()
    }
    return {"runs": runs, "cold_start": summary, "runner_breakdown": breakdown}


def steady(
    package: Path,
    runner: Path,
    batch: int,
    iters: int,
    rounds: int,
    work: Path,
    runner_warmup: int = 10,
) -> dict:
    from aotc.bench.contenders import place_baseline
    from aotc.bench.target import batch_axis

    loaded = aotc_runtime.load(package)
    signature, device = loaded.signature, loaded.device
    axis, _example = batch_axis(signature)
    inputs = signature.random_inputs(
        seed=0, sizes={axis: batch} if isinstance(axis, str) else {}, device=device
    )
    npz = work / f"inputs-{batch}.npz"
    numpy.savez(npz, **{spec.name: t.cpu().numpy() for spec, t in zip(signature.inputs, inputs)})
    manifest = loaded.manifest
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    program = place_baseline(Path(manifest.source.artifact), manifest, device)
    compiled = torch.compile(program.module(), mode=mode)
    samples = {"cpp runner": [], "python runtime": [], f"torch.compile {mode}": []}
    host, tf32 = [], None
    per_round = max(1, iters // rounds)
    with torch.inference_mode():
        for fn in (loaded, compiled):
            for _ in range(5):
                fn(*inputs)  # first calls: graph capture, compilation
        for _round in range(rounds):
            result = subprocess.run(
                [
                    str(runner),
                    str(package),
                    "--input",
                    str(npz),
                    "--iters",
                    str(per_round),
                    "--warmup",
                    str(runner_warmup),
                    "--json",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            report = json.loads(result.stdout)
            tf32 = report.get("tf32")
            samples["cpp runner"] += [report["latency"]["median_ms"]] * report["latency"]["n"]
            if report.get("host_latency"):
                host.append(report["host_latency"]["median_ms"])
            samples["python runtime"] += aotc_runtime.time_calls(
                lambda: loaded(*inputs), per_round, device, warmup=10
            )
            samples[f"torch.compile {mode}"] += aotc_runtime.time_calls(
                lambda: compiled(*inputs), per_round, device, warmup=10
            )
    out = {name: aotc_runtime.summarize(values) for name, values in samples.items()}
    out["cpp runner"]["note"] = (
        "per round the runner reports its median; the summary is over those medians"
    )
    if host:
        out["cpp runner"]["host_median_ms"] = statistics.median(host)
    out["cpp runner"]["tf32"] = tf32
    out["python runtime"]["tf32"] = {
        "cublas": torch.backends.cuda.matmul.allow_tf32,
        "cudnn": torch.backends.cudnn.allow_tf32,
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch-sizes", default="")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--runner-warmup",
        type=int,
        default=10,
        help="untimed calls in each runner process before its timed ones "
        "(a fresh process starts with the GPU at lower clocks)",
    )
    args = parser.parse_args()
    runner = runner_path()
    cuda = aotc_runtime.read_manifest(args.package).device.type == "cuda"
    result = {
        "package": str(args.package),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        **cold_starts(args.package, runner, args.runs, cuda),
    }
    sizes = [int(s) for s in args.batch_sizes.split(",") if s] or [None]
    with tempfile.TemporaryDirectory() as work:
        result["steady"] = {}
        for batch in sizes:
            if batch is None:
                from aotc.bench.target import batch_axis

                batch = batch_axis(aotc_runtime.read_manifest(args.package).signature)[1]
            result["steady"][str(batch)] = steady(
                args.package, runner, batch, args.iters, args.rounds, Path(work), args.runner_warmup
            )
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
