"""Why is a max-autotune build of densenet121 slow? One Inductor setting per run, on a small model.

densenet121's max-autotune build spends ~38 s per convolution benchmarking ~20 Triton choices,
compiling in the build process while it benchmarks (docs/benchmarks.md), while a small
post-activation model (conv -> BN -> ReLU -> conv) benchmarks the same GEMM in 0.6 s. densenet's
blocks are pre-activation (BN -> ReLU -> conv), so its GEMMs have a prologue to fuse. This runs
the AOTInductor build of a pre-activation block under one variant and prints the per-op
benchmarking times and Inductor's counters, to find the setting behind the slow benchmarking.

Result (H100, 2026-11-22): no variant reproduced it; every variant of both models benchmarked in
0.3-0.9 s per op (one outlier of 13.6 s with epilogue benchmarking off). The cause was elsewhere: the
build process and Inductor's compile workers used different ptxas binaries, so the workers'
precompiled kernels were never found (aotc/ptxas.py). A small model lowers before the worker pool is
ready and compiles everything in the build process, which is why it never showed the slowdown.

usage: python scripts/probe_max_autotune.py VARIANT [--post]   (VARIANT: base | no_coordesc |
       no_prologue | no_epilogue_bench); --post uses the post-activation model instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time

VARIANTS = {
    "base": {},
    "no_coordesc": {"coordinate_descent_tuning": False},
    "no_prologue": {"prologue_fusion": False},
    "no_epilogue_bench": {"benchmark_epilogue_fusion": False},
}


def model(post: bool):
    import torch.nn as nn

    if post:
        return nn.Sequential(nn.Conv2d(64, 128, 1), nn.BatchNorm2d(128), nn.ReLU(), nn.Conv2d(128, 32, 3, padding=1))
    return nn.Sequential(nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 128, 1, bias=False),
                         nn.BatchNorm2d(128), nn.ReLU(), nn.Conv2d(128, 32, 3, padding=1, bias=False))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=sorted(VARIANTS))
    parser.add_argument("--post", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu runs the same probe through the C++ GEMM templates (a smoke test)")
    args = parser.parse_args()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"probe_{args.variant}_")
    import torch
    from torch._dynamo.utils import counters

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    net = model(args.post).eval().to(args.device)
    x = torch.randn(16, 64, 32, 32, device=args.device)
    with torch.no_grad():
        program = torch.export.export(net, (x,))
    options = {"max_autotune": True, "coordinate_descent_tuning": True, **VARIANTS[args.variant]}
    began = time.perf_counter()
    log = tempfile.TemporaryFile("w+")
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)  # Inductor prints its autotune tables to stderr
    try:
        torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "m.pt2"),
                                                 inductor_configs=options)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
    seconds = time.perf_counter() - began
    log.seek(0)
    benchmarks = [float(m) for m in re.findall(r"benchmarking takes ([0-9.]+) seconds", log.read())]
    print(json.dumps({"variant": args.variant, "model": "post" if args.post else "pre", "build_s": round(seconds, 1),
                      "benchmark_s_per_op": benchmarks,
                      "counters": {k: v for k, v in counters["inductor"].items()
                                   if k.startswith(("select_algorithm", "coordesc", "async_compile", "benchmarking"))}}))


if __name__ == "__main__":
    main()
