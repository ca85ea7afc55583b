"""Cold start in fresh processes, compile caches, and the memory a contender needs.

Each cold run is `python -m aotc.bench.cold_child SPEC` (aotc/bench/cold_child.py): import torch,
load the contender, make inputs, call once, synchronize, print one JSON line. The parent's clock
runs from just before the spawn to the moment that line arrives, so interpreter start, imports,
loading and the first call (compilation, for torch.compile) all count. torch.compile runs twice
over: with a cold cache (a fresh, empty TORCHINDUCTOR_CACHE_DIR per run) and with a warm one (the
folder the first cold run filled). The child then reports its own peak memory: a fresh process
holding only that contender.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aotc.child_process import CHILD_TIMEOUT_S, child_command, child_env, failure_line
from aotc.env_vars import env_set
from aotc.errors import BuildError, ModelError, PackageError

if TYPE_CHECKING:
    from aotc_runtime import Manifest


@dataclass(frozen=True)
class ColdCase:
    name: str  # "package", "eager", "compile:default"
    cache: str | None = None  # torch.compile only: "cold" or "warm"

    @property
    def weight(self) -> int:
        """Rough cost on the progress bar, in timed slices: a process start ~10, a compile from scratch ~50."""
        return {None: 10, "warm": 20, "cold": 50}[self.cache]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.cache} cache)" if self.cache else self.name


def cold_start_plan(names, runs: int) -> list:
    """[(run index, ColdCase)], run by run so drift hits every case alike; cold before warm in each run."""
    cases = []
    for name in names:
        cases += (
            [ColdCase(name, "cold"), ColdCase(name, "warm")]
            if name.startswith("compile:")
            else [ColdCase(name)]
        )
    return [(run, case) for run in range(runs) for case in cases]


def measure_cold_starts(
    plan, package: Path, artifact: Path | None, manifest: Manifest, bar, others: dict | None = None
) -> list:
    """Run the plan; return one summary per case (times in ms, medians over runs).

    A baseline that cannot start in a fresh process (eager or torch.compile failing on this model)
    costs only its own row: it is reported as {"contender", "label", "error"} and the other cases,
    with everything measured before them, are kept. The package failing stays fatal: it is what
    the benchmark is about. `others`: contender name -> its own package folder (onnxruntime).
    """
    runs: dict = {}
    failed: dict = {}
    with tempfile.TemporaryDirectory(prefix="aotc-bench-cold-") as work:
        warm_dirs: dict = {}
        for run, case in plan:
            bar.step(f"cold start {run + 1}: {case.label}", case.weight)
            if case.name in failed:
                continue
            cache = Path(work) / f"{case.name.replace(':', '_')}-{run}-{case.cache or 'none'}"
            if case.cache == "warm":
                cache = warm_dirs[case.name]
            cache.mkdir(exist_ok=True)
            if case.cache == "cold":
                warm_dirs.setdefault(case.name, cache)
            try:
                runs.setdefault(case, []).append(
                    run_child(
                        case, (others or {}).get(case.name, package), artifact, manifest, cache
                    )
                )
            except (
                ModelError,
                BuildError,
            ) as exc:  # a baseline's failure (the package's is a PackageError)
                failed[case.name] = str(exc)
            if case.cache is None:
                shutil.rmtree(cache, ignore_errors=True)
    summaries = [
        summarize_cold(case, results) for case, results in runs.items() if case.name not in failed
    ]
    return summaries + [
        {"contender": name, "cache": None, "label": name, "error": error}
        for name, error in failed.items()
    ]


def summarize_cold(case: ColdCase, results: list) -> dict:
    totals = [r["total_ms"] for r in results]
    summary = {
        "contender": case.name,
        "cache": case.cache,
        "label": case.label,
        "runs_ms": totals,
        "median_ms": statistics.median(totals),
        "min_ms": min(totals),
        "max_ms": max(totals),
    }
    for key in ("startup_ms", "import_ms", "load_ms", "first_call_ms"):
        summary[key] = statistics.median(r[key] for r in results)
    for key in results[-1]["memory"]:
        summary[key] = max(r["memory"][key] for r in results)
    return summary


def child_spec(case: ColdCase, package: Path, artifact, manifest: Manifest) -> dict:
    device = manifest.device.type
    return {
        "kind": case.name.split(":")[0],
        "mode": case.name.partition(":")[2] or None,
        "package": str(package),
        "artifact": str(artifact) if artifact else None,
        "device": "cuda:0" if device == "cuda" else "cpu",
        "precision": manifest.precision,
        "tf32": manifest.precision == "tf32",
        "signature": manifest.signature.to_json(),
    }


def run_child(case: ColdCase, package: Path, artifact, manifest: Manifest, cache: Path) -> dict:
    """One fresh process; {'total_ms', 'startup_ms', 'import_ms', 'load_ms', 'first_call_ms', 'memory'}."""
    import torch

    env = child_env(
        TORCHINDUCTOR_CACHE_DIR=str(cache),
        TRITON_CACHE_DIR=str(cache / "triton"),
        # the CPU threads of the warm measurements (aotc bench --threads): torch and the C++
        # runner both take OMP_NUM_THREADS as their thread count
        OMP_NUM_THREADS=str(torch.get_num_threads()),
    )
    if case.name == "cpp":  # the C++ runner: no Python in the process at all
        from aotc.deploy.cpp_runner import runner_path

        command = [str(runner_path()), str(package), "--json"]
    else:
        command = child_command(
            "aotc.bench.cold_child", json.dumps(child_spec(case, package, artifact, manifest))
        )
    with tempfile.TemporaryFile("w+") as errors:
        started = time.perf_counter()
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=env,
        )
        killer = threading.Timer(CHILD_TIMEOUT_S, proc.kill)
        killer.start()
        try:
            first = proc.stdout.readline()
            total_ms = (time.perf_counter() - started) * 1e3
            rest = proc.stdout.read()
            proc.wait()
        finally:
            killer.cancel()
        errors.seek(0)
        stderr = errors.read()
    try:
        if case.name == "cpp":  # its report, printed once the first call is done
            report = json.loads(first + rest)
            phases = {
                "import_ms": 0.0,
                "load_ms": report["load_ms"],
                "first_call_ms": report["first_call_ms"],
            }
            memory: dict = {}
        else:
            phases, memory = json.loads(first), json.loads(rest.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError, KeyError):
        raise _child_error(case, proc.returncode, stderr) from None
    startup_ms = total_ms - phases["import_ms"] - phases["load_ms"] - phases["first_call_ms"]
    return {"total_ms": total_ms, "startup_ms": max(0.0, startup_ms), **phases, "memory": memory}


def _child_error(case: ColdCase, returncode: int, stderr: str) -> Exception:
    where = f"the cold-start process of {case.label} failed: {failure_line(stderr, returncode)}"
    if case.name == "package":
        return PackageError(f"{where}; run `aotc run` on the package to see why")
    if case.name == "eager":
        return ModelError(f"{where}; re-export the artifact with `aotc export`")
    return BuildError(f"{where}; leave {case.name} out of --against or pass --no-cold-start")


@contextlib.contextmanager
def fresh_compile_cache():
    """torch.compile in this process compiles from scratch, whatever the user's Inductor cache holds."""
    with tempfile.TemporaryDirectory(prefix="aotc-bench-cache-") as folder:
        try:
            from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
        except (
            ImportError
        ):  # older torch: the variable alone (read when Inductor first needs its cache)

            def temporary_cache_dir(folder):
                return env_set(TORCHINDUCTOR_CACHE_DIR=folder)

        with temporary_cache_dir(folder):
            yield folder
