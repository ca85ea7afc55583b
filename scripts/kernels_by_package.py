"""GPU time per kernel of several packages of one model, in one process (what makes one mode's kernels slower).

Each package is called with the same random input, warmed up, then profiled over `--calls` calls;
kernels are summed per call and grouped by family (Triton templates / pointwise / reductions, cuDNN,
cuBLAS and CUTLASS GEMMs, copies), so two packages' kernel time can be put side by side.

usage: python scripts/kernels_by_package.py PKG_DIR... [--calls 10] [--json OUT.json]
       [--batch-sizes 1,8,16] [--compile reduce-overhead]

With --batch-sizes, each package is profiled at those sizes of its first input's batch dim (a
--specialize package answers with the member built for that size); with --compile MODE,
torch.compile of the artifact the first package was built from is profiled beside them, on the
same inputs (what the tuned package's kernels are against torch.compile's).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

FAMILIES = (
    "triton_tem",
    "triton_poi",
    "triton_per",
    "triton_red",
    "cudnn",
    "sm90_xmma",
    "sm80_xmma",
    "cutlass",
    "cublasLt",
    "gemm",
    "Memcpy",
    "Memset",
)


def family(kernel: str) -> str:
    return next((f for f in FAMILIES if f.lower() in kernel.lower()), "other")


def gpu_events(fn, inputs, calls: int) -> list:
    """The profiler's GPU events (kernels and copies) of `calls` calls of `fn(*inputs)`, after one untimed call.

    Their `device_time` is in microseconds. The untimed call captures a CUDA graph where the package
    uses one, so what is profiled is the steady state.
    """
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        fn(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*inputs)
            torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == DeviceType.CUDA]


def kernel_ms_per_call(package, inputs, calls: int) -> dict[str, float]:
    """{kernel name: GPU ms per call}, summed over the kernel's launches in a call."""
    per_kernel: dict[str, float] = collections.defaultdict(float)
    for event in gpu_events(package, inputs, calls):
        per_kernel[event.name] += event.device_time / 1e3 / calls
    return per_kernel


def summarize_kernels(label: str, per_kernel: dict, top_n: int) -> dict:
    families: dict[str, float] = collections.defaultdict(float)
    for name, ms in per_kernel.items():
        families[family(name)] += ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top_n]
    entry = {
        "gpu_ms_per_call": round(sum(per_kernel.values()), 4),
        "kernels_per_call": len(per_kernel),
        "families_ms": {k: round(v, 4) for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
        "top_kernels_ms": [[round(ms, 4), name[:120]] for name, ms in top],
    }
    print(f"{label}: {entry['gpu_ms_per_call']:.3f} ms of GPU time per call")
    print("  by family: " + ", ".join(f"{k} {v:.3f}" for k, v in entry["families_ms"].items()))
    for ms, name in entry["top_kernels_ms"]:
        print(f"  {ms:8.4f}  {name}")
    return entry


def compiled_artifact(package, mode: str):
    """torch.compile(mode) of the program the package was built from, on the package's device."""
    import torch

    from aotc.bench.contenders import place_baseline

    ep = place_baseline(Path(package.manifest.source.artifact), package.manifest, package.device)
    return torch.compile(ep.module(), mode=mode, dynamic=False)  # one compile per size, as bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--batch-sizes", default="", help="e.g. 1,8,16 [default: the example size]")
    parser.add_argument("--compile", metavar="MODE", help="also profile torch.compile(mode=MODE)")
    args = parser.parse_args()
    import aotc_runtime
    from aotc.bench.target import batch_axis

    packages = {folder: aotc_runtime.load(folder) for folder in args.packages}
    for folder, package in packages.items():
        if package.device.type != "cuda":
            parser.error(
                f"{folder} is a {package.device.type} package; this profiles CUDA kernels: pass "
                "packages built with --device cuda"
            )
    first = next(iter(packages.values()))
    axis, example = batch_axis(first.signature)
    sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()] or [example]
    contenders = dict(packages.items())
    if args.compile:
        contenders[Path(f"torch.compile-{args.compile}")] = compiled_artifact(first, args.compile)
    result = {}
    for batch in sizes:
        # the same input for every contender
        dims = {axis: batch} if isinstance(axis, str) else {}
        inputs = first.signature.random_inputs(seed=0, sizes=dims, device=first.device)
        for folder, fn in contenders.items():
            label = f"{folder.name} batch {batch}"
            if hasattr(fn, "route"):
                ran = fn.route(*inputs).path.relative_to(fn.path).as_posix()
                label += f" (ran {ran})"
            per_kernel = kernel_ms_per_call(fn, inputs, args.calls)
            result[label] = summarize_kernels(label, per_kernel, args.top)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
