"""Build time: `aotc build` against a bare `aoti_compile_and_package` of the same program.

The targets: a build at most 1.1x (CUDA; 1.3x on the CPU VM) a bare AOTInductor compile of the
same placed program plus aotc's numeric check, each with a fresh Inductor cache. For each zoo model
(tests/zoo/catalog.py): export once, then two fresh processes, each timed whole (Python and torch
start-up included on both sides):
  aotc:  `aotc build ARTIFACT` (its stages from the manifest's build_phases);
  bare:  load the same artifact, place it as aotc does, `aoti_compile_and_package` with the options
         and compiler the aotc build recorded; Inductor's vector-ISA probe is timed on its own.
`$AOTC_CACHE_DIR` decides whether aotc finds the probe's answer (run twice to see both).

    python scripts/build_time.py distilbert_qa --device cuda --out bt.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AOTC = [sys.executable, "-m", "aotc"]


def timed(command: list, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    return time.perf_counter() - began, done


def fresh_inductor_env(scratch: Path, name: str) -> dict:
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(scratch / f"inductor-{name}")}


def measure(model, args, scratch: Path) -> dict:
    artifact, package = scratch / f"{model.name}.pt2", scratch / f"{model.name}_pkg"
    dims = [flag for dim in model.dims for flag in ("--dim", dim)]
    export_s, done = timed(
        [*AOTC, "export", f"tests/zoo/{model.file}", *dims, "-o", str(artifact), "--force"],
        dict(os.environ),
    )
    if done.returncode:
        return {"model": model.name, "error": f"export: {done.stderr.strip()[-300:]}"}
    build = [*AOTC, "build", str(artifact), "-o", str(package), "--device", args.device]
    build += ["--precision", args.precision, "--mode", args.mode, "--force", "--quiet"]
    aotc_s, done = timed(build, fresh_inductor_env(scratch, "aotc"))
    if done.returncode:
        return {"model": model.name, "error": f"aotc build: {done.stderr.strip()[-300:]}"}
    manifest = json.loads((package / "manifest.json").read_text())
    stages = {k: v["seconds"] for k, v in manifest["build_phases"].items() if k.startswith("aotc.")}
    probe = manifest["build_phases"].get("aotc.cpu_isa_probe", {})
    # the wall time outside build_package: interpreter and imports before, teardown after
    startup_s, _ = timed(
        [sys.executable, "-c", "import torch, aotc.cli.main, aotc.compiler.pipeline"],
        dict(os.environ),
    )
    bare = [sys.executable, __file__, "--bare", str(artifact), str(scratch / "bare.pt2")]
    bare += ["--device", args.device, "--precision", args.precision]
    bare += ["--options", json.dumps(manifest["inductor_options"])]
    bare_s, done = timed(bare, fresh_inductor_env(scratch, "bare"))
    if done.returncode:
        return {"model": model.name, "error": f"bare: {done.stderr.strip()[-300:]}"}
    inside = json.loads(done.stdout.strip().splitlines()[-1])
    check = stages.get("aotc.check", 0.0)
    return {
        "model": model.name,
        "device": args.device,
        "precision": args.precision,
        "mode": args.mode,
        "export_s": round(export_s, 1),
        "aotc_build_s": round(aotc_s, 1),
        "aotc_stages_s": stages,
        "aotc_inside_build_s": manifest["build_seconds"],
        "aotc_isa_probe_runs": probe.get("calls"),
        "cli_startup_s": round(startup_s, 1),
        "aotc_exit_s": round(aotc_s - manifest["build_seconds"] - startup_s, 1),
        "bare_s": round(bare_s, 1),
        "bare_inside_s": inside,
        "ratio_to_bare_plus_check": round(aotc_s / (bare_s + check), 3),
    }


def bare_compile(args) -> None:
    """The child: the program aotc compiles, compiled by AOTInductor alone."""
    began = time.perf_counter()
    import torch

    from aotc.compiler.toolchain import compiler_options
    from aotc.config import Precision
    from aotc.export.artifact import load_artifact
    from aotc.export.placement import place_program

    ep, meta = load_artifact(Path(args.bare[0]))
    placed = place_program(ep, args.device, Precision(args.precision), meta.signature)
    loaded = time.perf_counter()
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    pick_vec_isa()  # Inductor calls it in every AOT compile: timed apart
    probed = time.perf_counter()
    compiler, _record = compiler_options(True)
    options = {**json.loads(args.options), **compiler}
    torch._inductor.aoti_compile_and_package(
        placed, package_path=args.bare[1], inductor_configs=options
    )
    done = time.perf_counter()
    print(
        json.dumps(
            {
                "load_and_place": round(loaded - began, 2),
                "vec_isa_probe": round(probed - loaded, 2),
                "compile": round(done - probed, 2),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--mode", default="default")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--bare", nargs=2, metavar=("ARTIFACT", "PACKAGE"), help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare_compile(args)
        return
    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    import catalog

    by_name = {m.name: m for m in catalog.ZOO + catalog.GPU_ZOO}
    records = []
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="aotc-build-time-") as scratch:
            record = measure(by_name[name], args, Path(scratch))
        print(json.dumps(record), flush=True)
        records.append(record)
    if args.out:
        args.out.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
