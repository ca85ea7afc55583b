"""CPU benchmark for issue 2: the small CNN (16x3x128x128) as eager, torch.compile and aotc packages.

Steady state: all contenders in one process, timed interleaved (a slice of calls of each in turn,
so machine drift hits all alike); medians and percentiles. Cold start: fresh processes, alternated,
`aotc run PKG` (to first output) against `python -c "import torch"`.

usage: python scripts/bench_cpu.py [--workdir DIR] [--iters 200] [--cold-runs 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import aotc_runtime
from aotc_runtime.timing import summarize, time_calls

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "models" / "cnn_bn.py"
AOTC = [sys.executable, "-m", "aotc"]


def ensure_packages(workdir: Path) -> dict:
    artifact = workdir / "cnn.pt2"
    if not artifact.exists():
        subprocess.run(AOTC + ["export", str(MODEL), "--input-shape", "16x3x128x128", "-o", str(artifact)], check=True)
    packages = {}
    for mode in ("default", "max-autotune"):
        package = workdir / f"cnn_{mode}"
        if not package.exists():
            started = time.perf_counter()
            subprocess.run(AOTC + ["build", str(artifact), "--mode", mode, "--device", "cpu", "-o", str(package), "--quiet"], check=True)
            print(f"built {mode} in {time.perf_counter() - started:.1f}s", file=sys.stderr)
        packages[mode] = package
    return packages


def steady_state(packages: dict, iters: int, rounds: int = 10) -> dict:
    from aotc.loading import load_model

    x = torch.randn(16, 3, 128, 128)
    model = load_model(str(MODEL)).module
    compiled = torch.compile(model)
    contenders = {"eager": model, "torch.compile default": compiled}
    contenders.update({f"aotc package ({mode})": aotc_runtime.load(path) for mode, path in packages.items()})
    samples = {name: [] for name in contenders}
    first_call = {}
    with torch.inference_mode():
        for name, fn in contenders.items():
            started = time.perf_counter()
            fn(x)
            first_call[name] = (time.perf_counter() - started) * 1e3
            time_calls(lambda: fn(x), 0, torch.device("cpu"), warmup=10)
        per_round = max(1, iters // rounds)
        for _ in range(rounds):
            for name, fn in contenders.items():
                samples[name] += time_calls(lambda: fn(x), per_round, torch.device("cpu"))
    return {name: {**summarize(s), "first_call_ms": first_call[name]} for name, s in samples.items()}


def cold_start(package: Path, runs: int) -> dict:
    commands = {
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "aotc run PKG (to first output)": [str(Path(sys.executable).parent / "aotc"), "run", str(package)],
    }
    times = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            times[name].append(time.perf_counter() - started)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "runs": len(t)} for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--cold-runs", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="aotc-bench-cpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    packages = ensure_packages(workdir)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads",
        "steady_state_ms": steady_state(packages, args.iters),
        "cold_start": cold_start(packages["default"], args.cold_runs),
    }
    print(f"{'contender':32} {'median ms':>10} {'p90 ms':>8} {'p99 ms':>8}")
    for name, stats in result["steady_state_ms"].items():
        print(f"{name:32} {stats['median_ms']:10.3f} {stats['p90_ms']:8.3f} {stats['p99_ms']:8.3f}")
    for name, stats in result["cold_start"].items():
        print(f"cold start  {name:34} median {stats['median_s']:.2f} s (min {stats['min_s']:.2f} s, {stats['runs']} runs)")
    base = result["cold_start"]["python -c 'import torch'"]["median_s"]
    ratio = result["cold_start"]["aotc run PKG (to first output)"]["median_s"] / base
    print(f"cold start ratio aotc run / import torch: {ratio:.2f}x (target <= 1.3x)")
    result["cold_start_ratio"] = ratio
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
