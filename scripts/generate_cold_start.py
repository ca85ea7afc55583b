"""Cold start to the first generated token: the C++ runner in a fresh process, against a fresh
Python process that only imports torch and initializes CUDA (the floor of any Python runtime), and
the Python runtime's own first token. Each run is a new process; the three are interleaved, run
after run, so that drift on the machine hits them alike.

    python scripts/generate_cold_start.py LM_PKG [--runner PATH] [--runs 7] [--out cold.json]

The runner's time is its own `process_to_first_token_ms` (from the process's start to the first
token's callback) and the wall time of the whole process (spawn to exit, which adds unloading);
the others are wall times from spawn to exit of a process whose last act is that first token.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "5,17,42"

TORCH_INIT = (
    "import torch\n"
    "if torch.cuda.is_available():\n"
    "    torch.zeros(1, device='cuda'); torch.cuda.synchronize()\n"
)
PYTHON_FIRST_TOKEN = (
    "import sys, torch, aotc_runtime\n"
    "p = aotc_runtime.load(sys.argv[1])\n"
    "ids = torch.tensor([[int(t) for t in sys.argv[2].split(',')]])\n"
    "print(p.generate(ids, max_new_tokens=1)[0, -1].item())\n"
)


def timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    wall = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        sys.exit(f"{command[0]} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return wall, done.stdout


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "min_ms": round(ordered[0], 1),
        "max_ms": round(ordered[-1], 1),
        "runs": len(ordered),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--runner", default=os.environ.get("AOTC_RUNNER", "aotc-runner"))
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    runner_cmd = [args.runner, str(args.package), "--generate", "--prompt-ids", PROMPT,
                  "--max-new-tokens", "1", "--json"]  # fmt: skip
    times: dict[str, list[float]] = {"runner_first_token": [], "runner_process": [],
                                     "import_torch_cuda_init": [], "python_first_token": []}  # fmt: skip
    for _ in range(args.runs):
        wall, out = timed(runner_cmd)
        report = json.loads(out)
        times["runner_process"].append(wall)
        times["runner_first_token"].append(report["timings"]["process_to_first_token_ms"])
        times["import_torch_cuda_init"].append(timed([sys.executable, "-c", TORCH_INIT])[0])
        python = [sys.executable, "-c", PYTHON_FIRST_TOKEN, str(args.package), PROMPT]
        times["python_first_token"].append(timed(python)[0])
    result = {name: summary(values) for name, values in times.items()}
    floor = result["import_torch_cuda_init"]["median_ms"]
    result["runner_first_token_vs_import_torch"] = round(
        result["runner_first_token"]["median_ms"] / floor, 3
    )
    result["python_first_token_vs_import_torch"] = round(
        result["python_first_token"]["median_ms"] / floor, 3
    )
    result["machine"] = {"host": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M")}
    result["command"] = " ".join(runner_cmd)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
