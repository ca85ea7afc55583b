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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import aotc_runtime
from side_by_side import cold_starts, interleaved, print_table

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "models" / "cnn_bn.py"
AOTC = [sys.executable, "-m", "aotc"]


def ensure_packages(workdir: Path) -> dict:
    artifact = workdir / "cnn.pt2"
    if not artifact.exists():
        subprocess.run(AOTC + ["export", str(MODEL), "--input-shape", "16x3x128x128", "-o", str(artifact)], check=True)
    packages = {}
    # The default preset leaves freezing off, as torch.compile does; the variant shows what it would buy.
    variants = {"default": [], "default, freezing=true": ["--option", "freezing=true"], "max-autotune": []}
    for label, extra in variants.items():
        mode = label.split(",")[0]
        package = workdir / ("cnn_" + label.replace(", ", "_").replace("=", "-"))
        if not package.exists():
            started = time.perf_counter()
            subprocess.run(AOTC + ["build", str(artifact), "--mode", mode, "--device", "cpu", "-o", str(package), "--quiet", *extra], check=True)
            print(f"built {label} in {time.perf_counter() - started:.1f}s", file=sys.stderr)
        packages[label] = package
    return packages


def steady_state(packages: dict, iters: int) -> dict:
    from aotc.loading import load_model

    model = load_model(str(MODEL)).module
    contenders = {"eager": model, "torch.compile default": torch.compile(model)}
    contenders.update({f"aotc package ({mode})": aotc_runtime.load(path) for mode, path in packages.items()})
    return interleaved(contenders, [torch.randn(16, 3, 128, 128)], torch.device("cpu"), iters)


def cold_start(package: Path, runs: int) -> dict:
    return cold_starts({
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "aotc run PKG (to first output)": [str(Path(sys.executable).parent / "aotc"), "run", str(package)],
    }, runs)


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
    print_table(result["steady_state_ms"], result["cold_start"])
    base = result["cold_start"]["python -c 'import torch'"]["median_s"]
    ratio = result["cold_start"]["aotc run PKG (to first output)"]["median_s"] / base
    print(f"cold start ratio aotc run / import torch: {ratio:.2f}x (target <= 1.3x)")
    result["cold_start_ratio"] = ratio
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
