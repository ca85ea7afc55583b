"""Run the model zoo (tests/zoo/catalog.py) through aotc and write docs/models.md, a compatibility matrix.

    python scripts/zoo.py --device cpu --set zoo --merge                  # the small transformers models, on CPU
    python scripts/zoo.py --device cuda --set gpu --mode reduce-overhead --jobs 4 --merge   # realistic sizes, GPU
    python scripts/zoo.py --only bert gpt2 --iters 20 --out /tmp/m.md --work /tmp/zoo      # a few, quickly
    python scripts/zoo.py --backend onnxruntime --set zoo --jobs 2 --merge   # the ONNX Runtime backend, CPU
    python scripts/zoo.py --device cuda --set gpu --mode reduce-overhead --precision bf16 --jobs 4 --merge
                                                                        # bf16 packages, a table of their own

Per model, each step in a fresh process: `aotc export` (the catalog's --dim flags), `aotc build --json`
(status, seconds, package size, the build's own numeric check), then `python scripts/zoo.py _measure NAME PKG`:
eager vs the package on the file's example_inputs() (max abs error over all outputs, TF32 off on CUDA),
and latency of eager, the package and on CUDA torch.compile(mode="reduce-overhead"), interleaved in one
process (aotc bench's rounds: aotc.bench.contenders.interleaved). A failing step keeps the model in the table with
aotc's one-line `error:`; later steps show `-`. --jobs N runs the export+build of N models at once; the
measurements always run one at a time. Records go to JSON (default: --out with .json, one record per
model per device); --merge keeps the other records of that file, so CPU and GPU runs share one page.

--precision bf16 (or fp16) builds reduced-precision packages and compares each with eager run in that
precision (the model and its floating inputs cast to it): the error, and the latency of eager, the
package and torch.compile, are all of the same bf16 model. Its records (one per model, device,
backend and precision) get tables of their own.

--backend onnxruntime builds with `aotc build --backend onnxruntime` (CPU, mode default) instead: the
build's progress lines tell which of its steps failed (conversion to ONNX, ONNX Runtime's optimization
or load of the graph, the numeric check), and its records (one per model, device and backend) get a
table of their own, "ONNX Runtime backend (CPU)", with the onnx/onnxscript/onnxruntime versions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO_DIR = ROOT / "tests" / "zoo"
COMPILE = "compile:reduce-overhead"
AOTC = [sys.executable, "-m", "aotc"]  # the CLI of the same Python as this script
DEFAULT_BACKEND = "aotinductor"
# The sub-steps of `aotc build --backend onnxruntime`, as its table's columns name them.
ONNX_STEPS = {
    "convert": "ONNX conversion",
    "ort": "ORT optimize/load",
    "check": "numeric check",
}


def catalog():
    """tests/zoo/catalog.py, imported by path (tests/zoo on sys.path would shadow packages named t5, clip...)."""
    spec = importlib.util.spec_from_file_location("zoo_catalog", ZOO_DIR / "catalog.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def select_models(args) -> list:
    cat = catalog()
    pool = {"zoo": cat.ZOO, "gpu": cat.GPU_ZOO, "all": cat.ZOO + cat.GPU_ZOO}[args.set]
    if not args.only:
        return list(pool)
    by_name = {m.name: m for m in cat.ZOO + cat.GPU_ZOO}
    unknown = [n for n in args.only if n not in by_name]
    if unknown:
        print(
            f"error: --only {' '.join(unknown)}: not in tests/zoo/catalog.py (known: {', '.join(by_name)})",
            file=sys.stderr,
        )
        sys.exit(2)
    return [by_name[n] for n in args.only]


def error_line(stderr: str, code: int) -> str:
    """aotc's last `error: ...` line; else (a crash) the exit code and the last line of stderr."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1]
    return (
        f"error: exit {code} without an error line; stderr ends: {(lines or ['(empty)'])[-1][:300]}"
    )


def run_step(command: list, timeout: float, env=None) -> dict:
    """Run one step in a fresh process (its own process group, all killed on timeout): {status,
    wall_s, stdout, error}."""
    started = time.perf_counter()
    with subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the step and its compile workers
            _, stderr = proc.communicate()
            return {
                "status": "fail",
                "wall_s": timeout,
                "stdout": "",
                "stderr": stderr,
                "returncode": None,
                "error": f"error: timed out after {timeout:.0f} s",
            }
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {
            "status": "fail",
            "wall_s": wall,
            "stdout": stdout,
            "stderr": stderr,
            "returncode": proc.returncode,
            "error": error_line(stderr, proc.returncode),
        }
    return {
        "status": "ok",
        "wall_s": wall,
        "stdout": stdout,
        "stderr": stderr,
        "returncode": 0,
        "error": None,
    }


def last_json(stdout: str) -> dict:
    """The JSON a step printed on stdout ({} if none: the status stays, the figures are missing)."""
    start = stdout.find("{")
    try:
        return json.loads(stdout[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        return {}


def export_and_build(model, args, work: Path, env) -> dict:
    """The export and build steps of one model: {'export': {...}, 'build': {...} or None}."""
    artifact, package = work / f"{model.name}.pt2", work / f"{model.name}_pkg"
    dims = [flag for dim in model.dims for flag in ("--dim", dim)]
    step = run_step(
        [
            *AOTC,
            "export",
            f"tests/zoo/{model.file}",
            *dims,
            "-o",
            str(artifact),
            "--force",
            "--json",
        ],
        args.timeout,
        env,
    )
    export = {
        "status": step["status"],
        "seconds": last_json(step["stdout"]).get("seconds", step["wall_s"]),
        "error": step["error"],
    }
    result = {"export": export, "build": None, "package": str(package)}
    if step["status"] != "ok":
        return result
    onnx = args.backend == "onnxruntime"
    step = run_step(
        [
            *AOTC,
            "build",
            str(artifact),
            "-o",
            str(package),
            "--device",
            args.device,
            "--mode",
            args.mode,
            "--precision",
            args.precision,
            "--force",
            "--json",
            # ONNX: the progress lines on stderr say which of the build's steps failed
            *(["--backend", "onnxruntime"] if onnx else ["--quiet"]),
        ],
        args.timeout,
        env,
    )
    build = {
        "status": step["status"],
        "seconds": None,
        "size_bytes": None,
        "check_max_abs": None,
        "error": step["error"],
    }
    if onnx:
        build["failed_step"] = (
            None if step["status"] == "ok" else onnx_failed_step(step, build["error"])
        )
    if step["status"] == "ok":
        report = last_json(step["stdout"]) or last_json((package / "manifest.json").read_text())
        outputs = (report.get("numeric_check") or {}).get("outputs") or []
        build.update(
            seconds=report.get("build_seconds"),
            size_bytes=report.get("size_bytes"),
            check_max_abs=max((o["max_abs"] for o in outputs), default=None),
        )
    result["build"] = build
    return result


def onnx_failed_step(step: dict, error: str) -> str:
    """Which sub-step of `aotc build --backend onnxruntime` failed (a key of ONNX_STEPS): the last
    stage its progress announced and did not finish, refined by the exit code and the error."""
    started = None
    for line in step.get("stderr", "").splitlines():
        found = re.match(r"\[aotc\s+[\d.]+s\] (.*?)(: done in [\d.]+s| \.\.\.)$", line.strip())
        if found:
            started = None if found.group(2).startswith(":") else found.group(1)
    stage = started or ""
    code, error = step.get("returncode"), error or ""
    if stage.startswith("optimizing with ONNX Runtime"):
        return "ort"
    if stage.startswith("checking the package"):
        # the child that runs the package could not load it (ONNX Runtime refused the graph)
        return "ort" if code != 6 and "could not be loaded" in error else "check"
    if stage.startswith("converting to ONNX"):
        # the conversion runs the converted model in ONNX Runtime against eager: a session that
        # cannot be made (onnxruntime's exceptions read "[ONNXRuntimeError] : 1 : FAIL : ...") is
        # ONNX Runtime's refusal, not the exporter's
        return "ort" if "[ONNXRuntimeError]" in error else "convert"
    return "check" if code == 6 else "convert"


def measure_step(model, package: str, args) -> dict:
    """The run step: this script's _measure subcommand in a fresh process, which prints one JSON line."""
    compile_flag = "no-compile" if args.no_compile else "compile"
    step = run_step(
        [
            sys.executable,
            __file__,
            "_measure",
            model.name,
            package,
            args.device,
            str(args.iters),
            compile_flag,
            args.precision,
        ],
        args.timeout,
    )
    if step["status"] != "ok":
        return {"status": "fail", "error": step["error"]}
    lines = [line for line in step["stdout"].splitlines() if line.startswith("{")]
    return (
        last_json(lines[-1])
        if lines
        else {"status": "fail", "error": "error: _measure printed no result"}
    )


def split_inputs(produced) -> tuple:
    """example_inputs() as (args, kwargs): a tensor, a tuple (positional), a dict (keywords) or a (tuple, dict) pair."""
    if isinstance(produced, dict):
        return (), produced
    if (
        isinstance(produced, tuple)
        and len(produced) == 2
        and isinstance(produced[0], tuple)
        and isinstance(produced[1], dict)
    ):
        return produced
    return (tuple(produced) if isinstance(produced, (tuple, list)) else (produced,)), {}


def max_abs_error(eager_out, package_out) -> tuple:
    """(max abs difference over all outputs, the worst output's name); eager's outputs by aotc's names."""
    import torch

    from aotc.export.call_structure import flat_leaves, output_layout

    names, expected = output_layout(eager_out).names, flat_leaves(eager_out)
    if isinstance(package_out, dict):
        got = [package_out[name] for name in names]
    else:
        got = [package_out] if isinstance(package_out, torch.Tensor) else list(package_out)
    if len(got) != len(expected):
        raise ValueError(f"the package returned {len(got)} outputs, eager {len(expected)}")
    diffs = [
        ((e.double() - g.double()).abs().max().item() if e.numel() else 0.0, n)
        for e, g, n in zip(expected, got, names)
    ]
    return max(diffs)


def measure(
    name: str,
    package: str,
    device_type: str,
    iters: int,
    with_compile: bool = True,
    precision: str = "fp32",
) -> dict:
    """Eager vs package (and torch.compile on CUDA) on the model file's example inputs, in this
    process; in bf16 or fp16, eager and torch.compile run the model cast to that dtype, and the
    package takes the inputs as exported (it casts them itself)."""
    import torch

    import aotc_runtime
    from aotc.export.loading import load_model
    from aotc.math_mode import strict_fp32

    cat = catalog()
    model_entry = next(m for m in cat.ZOO + cat.GPU_ZOO if m.name == name)
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    # constructed after torch.manual_seed(0), as aotc export does
    loaded = load_model(f"tests/zoo/{model_entry.file}")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    model = loaded.module.to(device, dtype)

    def move(v):
        return v.to(device) if isinstance(v, torch.Tensor) else v

    def cast(v):  # eager's inputs in the model's precision; integer ids and masks stay as they are
        return v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    args, kwargs = split_inputs(loaded.example_inputs())
    args, kwargs = [move(a) for a in args], {k: move(v) for k, v in kwargs.items()}
    eager_args, eager_kwargs = [cast(a) for a in args], {k: cast(v) for k, v in kwargs.items()}
    # constants are baked into the package
    tensor_kwargs = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    result = {"status": "ok", "error": None, "compile_error": None}
    with torch.inference_mode():
        with (
            strict_fp32()
        ):  # fp32 on both sides for the error; latency below runs with the process's default flags
            checked = aotc_runtime.load(package)
            result["max_abs"], result["worst_output"] = max_abs_error(
                model(*eager_args, **eager_kwargs), checked(*args, **tensor_kwargs)
            )
        del checked  # a CUDA graph captured with TF32 off would keep it off: time a fresh load
        pkg = aotc_runtime.load(package)
        contenders = {
            "eager": lambda: model(*eager_args, **eager_kwargs),
            "package": lambda: pkg(*args, **tensor_kwargs),
        }
        if device.type == "cuda" and with_compile:
            compiled = torch.compile(model, mode="reduce-overhead")
            try:
                compiled(*eager_args, **eager_kwargs)
                contenders[COMPILE] = lambda: compiled(*eager_args, **eager_kwargs)
            except Exception as exc:  # reported in its column; eager and package are still measured
                result["compile_error"] = one_line(exc)
    result["latency"] = interleaved_latency(contenders, device, iters)
    return result


def interleaved_latency(
    contenders: dict, device, iters: int, warmup: int = 10, rounds: int = 10
) -> dict:
    """{name: latency summary + first_call_ms} of callables `fn()`, measured in this process.

    Each callable's first call and `warmup` untimed calls, then `iters` timed calls split into `rounds`
    interleaved rounds: aotc bench's own timing (aotc.bench.contenders.interleaved, aotc_runtime.time_calls).
    """
    import torch

    import aotc_runtime
    from aotc.bench.contenders import Contender, interleaved
    from aotc.progress import ProgressBar

    first_call = {}
    with torch.inference_mode():
        for name, fn in contenders.items():
            started = time.perf_counter()
            fn()
            aotc_runtime.synchronize(device)
            first_call[name] = (time.perf_counter() - started) * 1e3
            aotc_runtime.time_calls(fn, 0, device, warmup=warmup)
        # aotc bench's own contender record (its fields past `call` have defaults: `native` None,
        # an in-process callable)
        timed = [
            Contender(name=name, kind=name.split(":")[0], mode=None, call=fn)
            for name, fn in contenders.items()
        ]
        samples = interleaved(timed, [], iters, rounds, device, ProgressBar(enabled=False), "")
    return {
        name: {**aotc_runtime.summarize(times), "first_call_ms": first_call[name]}
        for name, times in samples.items()
    }


def one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"error: {type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def measure_main(
    name: str,
    package: str,
    device: str,
    iters: str,
    compile_flag: str = "compile",
    precision: str = "fp32",
) -> int:
    """`zoo.py _measure NAME PKG DEVICE ITERS [compile|no-compile] [PRECISION]`: prints one JSON
    line, a failure as aotc's one-line error."""
    from aotc.errors import AotcError, AotcRuntimeError

    try:
        result = measure(name, package, device, int(iters), compile_flag == "compile", precision)
    except Exception as exc:  # aotc's own errors read as the CLI prints them
        aotc_error = isinstance(exc, (AotcError, AotcRuntimeError))
        result = {"status": "fail", "error": f"error: {exc}" if aotc_error else one_line(exc)}
    print(json.dumps(result))
    return 0


def machine(device_type: str) -> dict:
    import torch

    from aotc.bench.machine import machine_description

    info = machine_description(
        torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    )
    name = info["gpu"] if device_type == "cuda" else f"{info['cpu']}, {info['cpu_count']} cores"
    return {"machine": name, "torch": info["torch"]}


def onnx_versions() -> dict:
    import onnx
    import onnxruntime
    import onnxscript

    return {
        "onnx": onnx.__version__,
        "onnxscript": onnxscript.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def backend_of(record: dict) -> str:
    """The record's build backend (records written before --backend existed are AOTInductor's)."""
    return record.get("backend", DEFAULT_BACKEND)


def precision_of(record: dict) -> str:
    """The record's build precision (records written before --precision existed are fp32)."""
    return record.get("precision", "fp32")


def new_record(model, args, host: dict, command: str) -> dict:
    # the default backend's and fp32's records keep their old shape (no "backend", "precision")
    backend = {} if args.backend == DEFAULT_BACKEND else {"backend": args.backend}
    backend.update({} if args.precision == "fp32" else {"precision": args.precision})
    return {
        "model": model.name,
        "family": model.family,
        "source": model.source,
        "dims": list(model.dims),
        "expected_failure": model.expected_failure,
        "device": args.device,
        "mode": args.mode,
        **backend,
        **host,
        "date": time.strftime("%Y-%m-%d"),
        "command": command,
        "export": None,
        "build": None,
        "run": None,
    }


def run_zoo(models: list, args, work: Path, command: str, checkpoint=lambda records: None) -> list:
    """Export+build (--jobs at once), then measure one at a time; one record per model.

    `checkpoint(records)` runs after the builds and after each measurement, so a run cut off by a
    time limit (the GPU machine's 10-minute calls) keeps what it measured.
    """
    host = machine(args.device)
    if args.backend == "onnxruntime":
        host["versions"] = onnx_versions()
    env = dict(os.environ)
    if args.jobs > 1:  # N builds at once share the cores among their Inductor compile workers
        env.setdefault(
            "TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs))
        )
    records = {m.name: new_record(m, args, host, command) for m in models}

    def one(model):
        steps = export_and_build(model, args, work, env)
        records[model.name].update(export=steps["export"], build=steps["build"])
        failed = (steps["build"] or {}).get("failed_step")
        print(
            f"[zoo] {model.name}: export {steps['export']['status']}, build "
            f"{(steps['build'] or {}).get('status', '-')}"
            + (f" ({ONNX_STEPS[failed]})" if failed else ""),
            file=sys.stderr,
            flush=True,
        )
        return steps["package"]

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        packages = dict(zip([m.name for m in models], pool.map(one, models)))
    checkpoint(list(records.values()))
    for model in models:
        record = records[model.name]
        if (record["build"] or {}).get("status") == "ok":
            # other processes on the machine skew latency (a 2-core CI box: by 100x)
            load = os.getloadavg()[0]
            record["run"] = {**measure_step(model, packages[model.name], args), "load_before": load}
            print(f"[zoo] {model.name}: run {record['run']['status']}", file=sys.stderr, flush=True)
            checkpoint(list(records.values()))
    return list(records.values())


def save_records(records: list, path: Path, merge: bool) -> list:
    """Write the JSON (with --merge: over the file's records, replacing those of the same model,
    device, backend and precision)."""
    from aotc.bench.report import write_json

    def key(r):
        return r["model"], r["device"], backend_of(r), precision_of(r)

    old = json.loads(path.read_text())["records"] if merge and path.is_file() else []
    new_keys = {key(r) for r in records}
    kept = [r for r in old if key(r) not in new_keys] + records
    write_json({"version": 1, "records": kept}, path)
    return kept


def _cell(value, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else "0" if value == 0 else fmt.format(value)


def _dims(dims: list) -> str:
    return ", ".join(d.split("@")[0] for d in dims) or "static"


def table_row(r: dict, cuda: bool) -> list:
    step = lambda s: "-" if s is None else s["status"]  # noqa: E731
    build, run = r["build"] or {}, r["run"] or {}
    lat = run.get("latency") or {}
    median = lambda name: (lat.get(name) or {}).get("median_ms")  # noqa: E731
    eager, package = median("eager"), median("package")
    size = build.get("size_bytes")
    row = [
        r["model"],
        r["family"],
        r["source"],
        _dims(r["dims"]),
        step(r["export"]),
        step(r["build"]),
        step(r["run"]),
        _cell(run.get("max_abs"), "{:.1e}"),
        _cell(build.get("seconds")),
        _cell(size / 1e6 if size else None),
        _cell(eager, "{:.3f}"),
        _cell(package, "{:.3f}"),
        _cell(eager / package if eager and package else None, "{:.2f}x"),
    ]
    if cuda:
        row.append("fail" if run.get("compile_error") else _cell(median(COMPILE), "{:.3f}"))
    return row


def failed_steps(r: dict) -> list:
    """(name, step) of each step of one model's record that ran and did not pass."""
    return [
        (name, r[name])
        for name in ("export", "build", "run")
        if r[name] and r[name]["status"] != "ok"
    ]


def failures(records: list) -> list:
    lines = []
    for r in records:
        expected = f" (expected: {r['expected_failure']})" if r["expected_failure"] else ""
        for name, step in failed_steps(r):
            lines.append(f"- **{r['model']}** ({name}){expected}: `{step['error']}`")
        if r["run"] and r["run"].get("compile_error"):
            lines.append(
                f"- **{r['model']}** (torch.compile reduce-overhead, baseline only): `{r['run']['compile_error']}`"
            )
        if r["expected_failure"] and all(
            r[s] and r[s]["status"] == "ok" for s in ("export", "build", "run")
        ):
            lines.append(
                f"- **{r['model']}** passes although the catalog expects a failure: {r['expected_failure']}"
            )
    return lines or ["- none"]


def onnx_steps(r: dict) -> list:
    """The ONNX build's sub-steps as table cells: ok up to the one that failed, fail, then -."""
    build = r["build"]
    if build is None:
        return ["-"] * len(ONNX_STEPS)
    if build["status"] == "ok":
        return ["ok"] * len(ONNX_STEPS)
    failed = list(ONNX_STEPS).index(build.get("failed_step") or "convert")
    return ["ok"] * failed + ["fail"] + ["-"] * (len(ONNX_STEPS) - failed - 1)


def onnx_table_row(r: dict) -> list:
    row = table_row(r, cuda=False)
    # model, family, source, dims, export | build -> its sub-steps | run, max abs | check max abs | ...
    check = (r["build"] or {}).get("check_max_abs")
    return row[:5] + onnx_steps(r) + row[6:8] + [_cell(check, "{:.1e}")] + row[8:]


def onnx_failures(records: list) -> list:
    lines = []
    for r in records:
        for name, step in failed_steps(r):
            label = ONNX_STEPS[step.get("failed_step") or "convert"] if name == "build" else name
            lines.append(f"- **{r['model']}** ({label}): `{step['error']}`")
    return lines or ["- none"]


def render_onnx(rows: list) -> list:
    """One "ONNX Runtime backend" section: the build's sub-steps as columns, the versions in the title."""
    first = rows[0]
    versions = "; ".join(f"{k} {v}" for k, v in (first.get("versions") or {}).items())
    header = [
        "model",
        "family",
        "source",
        "dynamic dims",
        "export",
        *ONNX_STEPS.values(),
        "run",
        "max abs err",
        "check max abs",
        "build s",
        "package MB",
        "eager ms",
        "package ms",
        "speedup",
    ]
    lines = [
        f"## ONNX Runtime backend ({first['device'].upper()}): {first['machine']}; torch "
        f"{first['torch']}; {versions}; {max(r['date'] for r in rows)}",
        "",
        "Each model exported as above, then built with `aotc build --backend onnxruntime`: the "
        "artifact converted by torch.onnx's dynamo exporter (onnx.checker, and the ONNX model run by "
        "ONNX Runtime without graph optimization against the program run eagerly), the graph "
        "optimized by ONNX Runtime (level all) and loaded, and the package checked against the "
        "program run eagerly at the example sizes and at the min and max of every dim (check max "
        "abs: the worst output over those). Then the package runs against eager as above (max abs "
        "err, latency). The build's steps are columns: the one that failed is `fail` with aotc's "
        "one-line error under Failures, later ones `-`.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += [
        "| " + " | ".join(c.replace("|", "\\|") for c in onnx_table_row(r)) + " |" for r in rows
    ]
    commands = sorted({r["command"] for r in rows})
    loads = [r["run"]["load_before"] for r in rows if r["run"] and "load_before" in r["run"]]
    load = (
        f" 1-minute load average before each measurement: {min(loads):.1f} to {max(loads):.1f} on this machine."
        if loads
        else ""
    )
    lines += [
        "",
        f"Latency: medians on the example inputs; speedup = eager / package.{load} Made by: "
        + "; ".join(f"`{c}`" for c in commands),
        "",
        "Failures:",
        "",
        *onnx_failures(rows),
        "",
    ]
    return lines


HAND_WRITTEN = (
    "<!-- Written by hand: scripts/zoo.py keeps what follows when it rewrites this page. -->"
)


def hand_written(page: Path) -> str:
    """What the page holds below HAND_WRITTEN (notes on the tables, the text-generation families),
    to be kept under the regenerated tables."""
    text = page.read_text() if page.exists() else ""
    return "\n" + text[text.index(HAND_WRITTEN) :] if HAND_WRITTEN in text else ""


def render(records: list, json_name: str) -> str:
    """docs/models.md: one table per (device, machine, torch, mode) in catalog order, each with its failures."""
    cat, groups, onnx_groups = catalog(), {}, {}
    order = {m.name: i for i, m in enumerate(cat.ZOO + cat.GPU_ZOO)}
    for r in sorted(records, key=lambda r: order.get(r["model"], len(order))):
        # other backends: after the AOTInductor tables, in sections of their own
        if backend_of(r) != DEFAULT_BACKEND:
            versions = json.dumps(r.get("versions"), sort_keys=True)
            onnx_groups.setdefault((r["device"], r["machine"], r["torch"], versions), []).append(r)
            continue
        key = (r["device"], r["machine"], r["torch"], r["mode"], precision_of(r))
        groups.setdefault(key, []).append(r)
    lines = [
        "# aotc model zoo: compatibility matrix",
        "",
        "Each model of tests/zoo/catalog.py (random weights, small configs on CPU, realistic sizes in the GPU set) "
        "goes through `aotc export` (with the catalog's dynamic dims), `aotc build` (which runs its own numeric "
        "check at the example sizes and at the min and max of every dim) and a run of the package against "
        "eager on the model file's example_inputs(): max abs error over all outputs (fp32, TF32 off on CUDA), "
        "then median latency of eager and the package (and torch.compile reduce-overhead on CUDA), timed "
        "interleaved in one process. A failed step is `fail` with aotc's one-line error under Failures; later "
        "steps show `-`. Generated by `scripts/zoo.py` (the commands are under each table; records in "
        f"{json_name}).",
        "",
    ]
    # fp32's tables first, then bf16's and fp16's
    ranked = {"fp32": 0, "bf16": 1, "fp16": 2}
    for (device, host, torch_version, mode, precision), rows in sorted(
        groups.items(), key=lambda item: (ranked.get(item[0][4], 3), item[0])
    ):
        cuda = device == "cuda"
        date = max(r["date"] for r in rows)
        reduced = precision != "fp32"
        header = [
            "model",
            "family",
            "source",
            "dynamic dims",
            "export",
            "build",
            "run",
            f"max abs err vs eager {precision}" if reduced else "max abs err",
            "build s",
            "package MB",
            "eager ms",
            "package ms",
            "speedup",
        ] + ([f"compile r-o ms ({precision})" if reduced else "compile r-o ms"] if cuda else [])
        title = f"## {device.upper()}: {host}; torch {torch_version}; {date}; mode {mode}"
        lines += [title + (f"; {precision}" if reduced else ""), ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += [
            "| " + " | ".join(c.replace("|", "\\|") for c in table_row(r, cuda)) + " |"
            for r in rows
        ]
        commands = sorted({r["command"] for r in rows})
        loads = [r["run"]["load_before"] for r in rows if r["run"] and "load_before" in r["run"]]
        load = (
            f" 1-minute load average before each measurement: {min(loads):.1f} to {max(loads):.1f} on this machine."
            if loads
            else ""
        )
        lines += (
            [
                "",
                f"Latency: medians on the example inputs; speedup = eager / package.{load} Made by: "
                + "; ".join(f"`{c}`" for c in commands),
                "",
                "Failures:",
                "",
            ]
            + failures(rows)
            + [""]
        )
    for _key, rows in sorted(onnx_groups.items()):
        lines += render_onnx(rows)
    return "\n".join(lines)


def parse_args(argv: list):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--set", choices=("zoo", "gpu", "all"), default="zoo")
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="these models (any set) instead of --set"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "models.md")
    parser.add_argument("--json", type=Path, help="records file [default: --out with .json]")
    parser.add_argument(
        "--merge", action="store_true", help="keep the JSON's other records (other devices/models)"
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="folder for artifacts and packages [default: a temporary one, removed]",
    )
    parser.add_argument("--mode", default="default", help="aotc build --mode")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="aotc build --precision; eager and torch.compile run the model in it too",
    )
    parser.add_argument(
        "--backend",
        choices=(DEFAULT_BACKEND, "onnxruntime"),
        default=DEFAULT_BACKEND,
        help="aotc build --backend (onnxruntime: CPU and mode default only) [default: aotinductor]",
    )
    parser.add_argument("--jobs", type=int, default=1, help="export+build steps run at once")
    parser.add_argument("--iters", type=int, default=100, help="timed calls per contender")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per step")
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="on CUDA, leave out the torch.compile reduce-overhead column (its compile takes minutes per model)",
    )
    args = parser.parse_args(argv)
    if args.backend == "onnxruntime" and (
        args.device != "cpu" or args.mode != "default" or args.precision != "fp32"
    ):
        parser.error(
            "--backend onnxruntime builds CPU fp32 packages: --device cpu, --mode default, "
            "--precision fp32"
        )
    return args


def main(argv: list) -> int:
    if argv[:1] == ["_measure"]:
        return measure_main(*argv[1:])
    args = parse_args(argv)
    models = select_models(args)
    command = "python scripts/zoo.py " + shlex.join(argv)
    with tempfile.TemporaryDirectory(prefix="aotc-zoo-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        json_path = args.json or args.out.with_suffix(".json")

        def write(records):
            everything = save_records(records, json_path, args.merge)
            args.out.write_text(render(everything, json_path.name) + hand_written(args.out))

        write(run_zoo(models, args, work.resolve(), command, checkpoint=write))
    print(f"wrote {args.out} and {json_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
