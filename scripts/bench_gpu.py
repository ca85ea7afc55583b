"""GPU benchmark for issue 3: densenet121 (16x3x128x128, fp32) as eager, torch.compile and aotc packages.

One process, interleaved, CUDA events: eager, torch.compile default / reduce-overhead, and the aotc
packages of the three modes. Then cold starts in fresh processes (`aotc run PKG` against bare
`import torch` + CUDA init), a profile of each package (GPU kernel time per call against the call's
latency: the rest is launch overhead and copies), and build time / size from the manifests.

usage: python scripts/bench_gpu.py --workdir DIR [--iters 100] [--cold-runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

import aotc_runtime
from side_by_side import cold_starts, gpu_events, interleaved, print_table

MODES = ("default", "reduce-overhead", "max-autotune")
AOTC = [sys.executable, "-m", "aotc"]


def ensure_packages(workdir: Path, modes) -> dict:
    artifact = workdir / "densenet121.pt2"
    if not artifact.exists():
        subprocess.run(AOTC + ["export", "torchvision.models:densenet121", "--input-shape", "16x3x128x128", "-o", str(artifact)], check=True)
    packages = {}
    for mode in modes:
        package = workdir / f"densenet121_{mode}"
        if not (package / "manifest.json").exists():
            subprocess.run(AOTC + ["build", str(artifact), "--device", "cuda", "--mode", mode, "-o", str(package), "--force"], check=True)
        packages[mode] = package
    return packages


def kernel_ms_per_call(fn, inputs, calls: int = 20) -> tuple[float, float]:
    """(sum of GPU kernel and memcpy time per call in ms, GPU events per call), from the profiler."""
    on_gpu = gpu_events(fn, inputs, calls)
    return sum(e.device_time for e in on_gpu) / 1e3 / calls, len(on_gpu) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--cold-runs", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES), help="package modes to build and compare")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=PACKAGE",
                        help="another package folder to time side by side (e.g. a build with different --option)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    packages = ensure_packages(args.workdir, [m for m in args.modes.split(",") if m])

    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.densenet121().eval().cuda()
    loaded = {mode: aotc_runtime.load(path) for mode, path in packages.items()}
    contenders = {"eager": model}
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        contenders[f"torch.compile {mode}"] = torch.compile(model, mode=mode)
    contenders.update({f"aotc {mode}": package for mode, package in loaded.items()})
    if "reduce-overhead" in packages:  # the opt-in that returns graph buffers, as torch.compile does
        contenders["aotc reduce-overhead, reuse_outputs"] = aotc_runtime.load(packages["reduce-overhead"], reuse_outputs=True)
    for extra in args.extra:
        name, _, path = extra.partition("=")
        contenders[f"aotc {name}"] = aotc_runtime.load(path)
    x = torch.randn(16, 3, 128, 128, device="cuda")
    steady = interleaved(contenders, [x], torch.device("cuda"), args.iters)

    aotc_bin = str(Path(sys.executable).parent / "aotc")
    commands = {"import torch + CUDA init": [sys.executable, "-c", "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"]}
    commands.update({f"aotc run ({mode})": [aotc_bin, "run", str(path)] for mode, path in packages.items()})
    cold = cold_starts(commands, args.cold_runs)

    # GPU kernel time per call against latency, for the baselines too: a gap is then put on kernels
    # or on what surrounds them (launches, copies, Python).
    profile = {}
    for name, fn in contenders.items():
        if name != "eager":
            kernels, count = kernel_ms_per_call(fn, [x])
            latency = steady[name]["median_ms"]
            profile[name] = {"latency_ms": latency, "gpu_kernel_ms": kernels, "overhead_ms": latency - kernels, "gpu_events_per_call": count}
    builds = {mode: {"build_seconds": p.manifest["build_seconds"], "size_mb": p.manifest["size_bytes"] / 1e6} for mode, p in loaded.items()}

    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}",
        "steady_state_ms": steady, "cold_start": cold, "profile": profile, "builds": builds,
    }
    print_table(steady, cold)
    for mode, p in profile.items():
        print(f"profile {mode:36} latency {p['latency_ms']:.3f} ms = GPU kernels {p['gpu_kernel_ms']:.3f} ms + overhead {p['overhead_ms']:.3f} ms ({p['gpu_events_per_call']:.0f} GPU events per call)")
    for mode, b in builds.items():
        print(f"build   aotc {mode:16} {b['build_seconds']:.1f} s, {b['size_mb']:.1f} MB")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
