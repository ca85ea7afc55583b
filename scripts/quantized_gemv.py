"""How fast each quantized linear runs at decode sizes: the kernel choices behind `--quantize`.

For each weight shape of a model (default: the Llama-3.2-1B shape's four stacked linears and its
lm_head) and each row count, times the base-precision product and every quantized form aotc could
lower to, each compiled by Inductor (torch.compile, the compiler AOTInductor runs) and replayed 50
times in one CUDA graph (CPU: a timed loop), and reports microseconds per call with the bandwidth
the weight bytes imply.

    python scripts/quantized_gemv.py --device cuda --out gemv.json
    python scripts/quantized_gemv.py --device cpu --shapes 576x1728,576x576,576x3072,1536x576

`base-triton` is the base-precision weight through aotc's Triton GEMV, beside cuBLAS's `base`:
at SmolLM2's shapes (`--shapes 576x960,576x576,576x3072,1536x576`) a decode step's products are
latency, not bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotc.export import quantized_linear as ql  # noqa: E402

LLAMA_1B = "2048x3072,2048x2048,2048x16384,8192x2048,2048x128256"


def forms(device: str) -> list[str]:
    cuda = [
        "base",
        "base-triton",
        "int8-rows",
        "int8-triton",
        "int4-tinygemm",
        "int4-rows",
        "fp8-scaled-mm",
        "fp8-triton",
        "fp8-blocks-triton",
    ]
    cpu = ["base", "int8-rows", "int8-pack-mm", "int4-rows", "int8-dynamic"]
    return cuda if device == "cuda" else cpu


def make(form: str, w, dtype, group: int):
    """(function of x, bytes of weight the function reads)."""
    import torch

    if form == "base":
        wb = w.to(dtype)
        return (lambda x: torch.nn.functional.linear(x, wb)), wb.numel() * wb.element_size()
    if form == "base-triton":  # the base-precision weight through aotc's GEMV (cuBLAS's rival)
        from aotc.kernels import gemv as gemv_kernel

        wb = w.to(dtype)
        return (
            lambda x: gemv_kernel.partial_products(x, wb, None).sum(0).to(x.dtype),
            wb.numel() * wb.element_size(),
        )
    if form == "fp8-blocks-triton":  # what an fp8 package runs: a scale per block of features
        from aotc.kernels import gemv as gemv_kernel

        q, s = ql.fp8_blocks(w)
        return (lambda x: gemv_kernel.blocks_gemv(x, q, s)), q.numel() + s.numel() * 4
    if form in ("int8-rows", "int8-triton", "int8-pack-mm", "int8-dynamic"):
        q, s = ql.int8_rows(w, dtype)
        if form == "int8-rows":
            return (lambda x: ql.int8_rows_gemv(x, q, s)), q.numel()
        if form == "int8-triton":
            from aotc.kernels import gemv as gemv_kernel

            return (lambda x: gemv_kernel.rows_gemv(x, q, s)), q.numel()
        if form == "int8-pack-mm":
            return (lambda x: torch.ops.aten._weight_int8pack_mm(x, q, s)), q.numel()
        qt = q.t().contiguous()
        return (lambda x: ql.int8_dynamic_mm(x, qt, s)), q.numel()
    if form == "int4-rows":
        nib, sc = ql.int4_groups(w, group, dtype)
        return (lambda x: ql.int4_groups_gemv(x, nib, sc, group)), nib.numel() + sc.numel() * 2
    if form == "int4-tinygemm":
        packed, sz = ql.int4_tinygemm(w, group)
        return (
            lambda x: ql.int4_tinygemm_mm(x, packed, sz, group),
            packed.numel() * 4 + sz.numel() * 2,
        )
    if form in ("fp8-scaled-mm", "fp8-triton"):
        q, s = ql.fp8_rows(w)
        if form == "fp8-triton":
            from aotc.kernels import gemv as gemv_kernel

            return (lambda x: gemv_kernel.rows_gemv(x, q, s)), q.numel()
        return (lambda x: ql.fp8_scaled_mm(x, q, s)), q.numel()
    raise ValueError(form)


def time_cuda(fn, x, reps: int = 50, rounds: int = 7) -> float:
    import torch

    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn(x)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def time_cpu(fn, x, reps: int = 200) -> float:
    for _ in range(10):
        fn(x)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps // 5):
            fn(x)
        times.append((time.perf_counter() - t) / (reps // 5) * 1e6)
    return statistics.median(times)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default=LLAMA_1B, help="KxN,... (in features x out features)")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--coordinate-descent", action="store_true", help="Inductor's coordinate_descent_tuning on"
    )
    parser.add_argument("--forms", help="only these forms, comma-separated")
    args = parser.parse_args()
    torch._inductor.config.coordinate_descent_tuning = args.coordinate_descent
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    results = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k, device=args.device) * 0.02
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, device=args.device, dtype=dtype)
            ref = x.float() @ w.t()
            for form in args.forms.split(",") if args.forms else forms(args.device):
                try:
                    fn, nbytes = make(form, w, dtype, args.group_size)
                    torch._dynamo.reset()  # each form its own compile: the lambdas share code
                    compiled = torch.compile(fn, fullgraph=True, dynamic=False)
                    out = compiled(x)
                    err = float((out.float() - ref).norm() / ref.norm())
                    us = (time_cuda if args.device == "cuda" else time_cpu)(compiled, x)
                    row = {
                        "k": k,
                        "n": n,
                        "rows": rows,
                        "form": form,
                        "cdt": args.coordinate_descent,
                        "us": round(us, 2),
                        "weight_bytes": nbytes,
                        "gb_s": round(nbytes / us / 1e3, 1),
                        "rel_error": round(err, 4),
                    }
                except Exception as exc:  # a form this device or shape cannot run
                    row = {
                        "k": k,
                        "n": n,
                        "rows": rows,
                        "form": form,
                        "failed": f"{type(exc).__name__}: {str(exc)[:1500]}",
                    }
                results.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": args.device, "results": results}, indent=1))


if __name__ == "__main__":
    main()
