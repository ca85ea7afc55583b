"""Soak figures for docs/reliability.md: 10,000 calls into each package with memory sampled, then
100 load/unload cycles; prints a Markdown table and writes JSON.

usage: python scripts/soak.py PKG [PKG ...] [--calls 10000] [--cycles 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

import aotc_runtime
from aotc.bench.soak import load_unload_cycles, soak_calls


def thread_throughput(path: str, threads: int, calls: int = 200) -> dict:
    """calls/s of one thread, and of `threads` threads with all-core intra-op threads (what a naive
    server gets) and with cores/N each (what aotc run --threads and the README advise)."""
    package = aotc_runtime.load(path, threads=threads)
    inputs = package.signature.random_inputs(seed=0, device=package.device)
    cores = torch.get_num_threads()
    settings = (
        ("1 thread", 1, cores),
        (f"{threads} threads x {cores} intra-op", threads, cores),
        (f"{threads} threads x cores/N intra-op", threads, aotc_runtime.intra_op_threads(threads)),
    )
    return {
        label: aotc_runtime.run_concurrently(package, inputs, count, calls, intra_op=intra)[
            "calls_per_second"
        ]
        for label, count, intra in settings
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="also: throughput of 1 thread and of N threads, with all-core and cores/N intra-op threads",
    )
    args = parser.parse_args()
    rows = []
    for path in args.packages:
        package = aotc_runtime.load(path)
        inputs = package.signature.random_inputs(seed=0, device=package.device)
        calls = soak_calls(package, inputs, args.calls)
        device = str(package.device)
        del package
        cycles = load_unload_cycles(path, args.cycles)
        row = {"package": path, "device": device, "calls": calls, "cycles": cycles}
        if args.threads:
            row["threads"] = thread_throughput(path, args.threads)
        rows.append(row)
    machine = (
        f"{platform.node()}, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}"
    )
    print(f"{time.strftime('%Y-%m-%d')}, {machine}, torch {torch.__version__}")
    print(
        "| package | device | calls | RssAnon growth (max) MiB | CUDA allocated growth MiB | "
        "load/unload cycles | VmRSS per cycle MiB | RssAnon per cycle MiB | CUDA allocated per cycle MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        calls, cycles = row["calls"], row["cycles"]
        print(
            f"| {row['package']} | {row['device']} | {calls['calls']} | "
            f"{calls['max_growth_mib'].get('RssAnon', '-')} | {calls['growth_mib'].get('cuda_allocated', '-')} | "
            f"{cycles['cycles']} | {cycles['per_cycle_mib'].get('VmRSS', '-')} | "
            f"{cycles['per_cycle_mib'].get('RssAnon', '-')} | {cycles['per_cycle_mib'].get('cuda_allocated', '-')} |"
        )
    for row in rows:
        for label, figure in row.get("threads", {}).items():
            print(f"{row['package']}: {label}: {figure:.1f} calls/s")
    if args.json_out:
        with open(args.json_out, "w") as handle:
            json.dump(
                {"machine": machine, "torch": torch.__version__, "rows": rows}, handle, indent=2
            )


if __name__ == "__main__":
    main()
