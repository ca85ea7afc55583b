"""Cold start in fresh processes, compile caches, and the memory a contender needs.

Each cold run is `python -c CHILD SPEC`: import torch, load the contender, make inputs, call once,
synchronize, print one JSON line. The parent's clock runs from just before the spawn to the moment
that line arrives, so interpreter start, imports, loading and the first call (compilation, for
torch.compile) all count. torch.compile runs twice over: with a cold cache (a fresh, empty
TORCHINDUCTOR_CACHE_DIR per run) and with a warm one (the folder the first cold run filled). The
child then reports its own peak memory: a fresh process holding only that contender.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import BuildError, ModelError, PackageError

CHILD_TIMEOUT_S = 1800

CHILD = r"""
import json, resource, sys, time
began = time.perf_counter()
import torch
imported = time.perf_counter()
spec = json.loads(sys.argv[1])
device = torch.device(spec["device"])
if device.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = spec["tf32"]
    torch.zeros(1, device=device)  # the CUDA context, which any model on this GPU needs
    free_at_start = torch.cuda.mem_get_info(device)[0]
if spec["kind"] == "package":
    import aotc_runtime
    model = aotc_runtime.load(spec["package"])
else:
    program = torch.export.load(spec["artifact"])
    if spec["precision"] in ("bf16", "fp16") or device.type != "cpu":
        # The same placement the build's eager reference gets: reduced precision, and on a GPU the
        # CPU-traced views made reshapes (vit_b_16's attention strides differ there). Importing
        # aotc for it adds about 11 ms to the baseline's seconds-long cold start.
        from aotc.config import Precision
        from aotc.precision import place_program
        program = place_program(program, device.type, Precision(spec["precision"]), spec["signature"])
    model = program.module()
    if spec["kind"] == "compile":
        model = torch.compile(model, mode=spec["mode"])
loaded = time.perf_counter()
from aotc_runtime.signature import Signature
inputs = Signature.from_dict(spec["signature"]).random_inputs(seed=0, device=device)
with torch.inference_mode():
    model(*inputs)
if device.type == "cuda":
    torch.cuda.synchronize(device)
done = time.perf_counter()
print(json.dumps({"import_ms": (imported - began) * 1e3, "load_ms": (loaded - imported) * 1e3, "first_call_ms": (done - loaded) * 1e3}), flush=True)
try:  # VmHWM: ru_maxrss would carry the parent's peak over the exec on Linux
    status = open("/proc/self/status").read().split("VmHWM:")[1].split()
    memory = {"peak_rss_mb": int(status[0]) / 1024}
except (OSError, IndexError, ValueError):
    memory = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
if device.type == "cuda":
    memory["cuda_allocator_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    # AOTInductor allocates a package's weights with cudaMalloc, outside the caching allocator.
    memory["cuda_device_used_mb"] = (free_at_start - torch.cuda.mem_get_info(device)[0]) / 2**20
print(json.dumps(memory), flush=True)
"""


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
        cases += [ColdCase(name, "cold"), ColdCase(name, "warm")] if name.startswith("compile:") else [ColdCase(name)]
    return [(run, case) for run in range(runs) for case in cases]


def measure_cold_starts(plan, package: Path, artifact: Path | None, manifest: dict, bar) -> list:
    """Run the plan; return one summary per case (times in ms, medians over runs).

    A baseline that cannot start in a fresh process (eager or torch.compile failing on this model)
    costs only its own row: it is reported as {"contender", "label", "error"} and the other cases,
    with everything measured before them, are kept. The package failing stays fatal: it is what
    the benchmark is about.
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
                runs.setdefault(case, []).append(run_child(case, package, artifact, manifest, cache))
            except (ModelError, BuildError) as exc:  # a baseline's failure (the package's is a PackageError)
                failed[case.name] = str(exc)
            if case.cache is None:
                shutil.rmtree(cache, ignore_errors=True)
    summaries = [summarize_cold(case, results) for case, results in runs.items() if case.name not in failed]
    return summaries + [{"contender": name, "cache": None, "label": name, "error": error} for name, error in failed.items()]


def summarize_cold(case: ColdCase, results: list) -> dict:
    totals = [r["total_ms"] for r in results]
    summary = {"contender": case.name, "cache": case.cache, "label": case.label, "runs_ms": totals,
               "median_ms": statistics.median(totals), "min_ms": min(totals), "max_ms": max(totals)}
    for key in ("startup_ms", "import_ms", "load_ms", "first_call_ms"):
        summary[key] = statistics.median(r[key] for r in results)
    for key in results[-1]["memory"]:
        summary[key] = max(r["memory"][key] for r in results)
    return summary


def child_spec(case: ColdCase, package: Path, artifact, manifest: dict) -> dict:
    device = manifest["device"]["type"]
    return {"kind": case.name.split(":")[0], "mode": case.name.partition(":")[2] or None, "package": str(package),
            "artifact": str(artifact) if artifact else None, "device": "cuda:0" if device == "cuda" else "cpu",
            "precision": manifest.get("precision", "fp32"), "tf32": manifest.get("precision") == "tf32",
            "signature": manifest["signature"]}


def run_child(case: ColdCase, package: Path, artifact, manifest: dict, cache: Path) -> dict:
    """One fresh process; {'total_ms', 'startup_ms', 'import_ms', 'load_ms', 'first_call_ms', 'memory'}."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton")}
    spec = json.dumps(child_spec(case, package, artifact, manifest))
    with tempfile.TemporaryFile("w+") as errors:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, spec], stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
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
        phases, memory = json.loads(first), json.loads(rest.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise _child_error(case, proc.returncode, stderr) from None
    startup_ms = total_ms - phases["import_ms"] - phases["load_ms"] - phases["first_call_ms"]
    return {"total_ms": total_ms, "startup_ms": max(0.0, startup_ms), **phases, "memory": memory}


def _child_error(case: ColdCase, returncode: int, stderr: str) -> Exception:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1].strip()[:300] if lines else f"exit status {returncode}"
    where = f"the cold-start process of {case.label} failed: {last}"
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
        except ImportError:  # older torch: the variable alone (read when Inductor first needs its cache)
            temporary_cache_dir = _cache_dir_variable
        with temporary_cache_dir(folder):
            yield folder


@contextlib.contextmanager
def _cache_dir_variable(folder: str):
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


class MemoryWatch:
    """Extra memory a block of calls needs: CUDA allocator peak above the start, or RSS growth sampled every ms."""

    def __init__(self, device):
        self.device = device
        self.peak_mb = None

    def __enter__(self):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        self._base = self._peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        if self._base is not None:
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self._peak = max(self._peak, _rss_bytes() or 0)

    def __exit__(self, *exc):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
        elif self._base is not None:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, _rss_bytes() or 0)
            self.peak_mb = (self._peak - self._base) / 2**20
        return False


def _rss_bytes():
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


