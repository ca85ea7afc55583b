"""A decode step's products with their neighbours, three ways, side by side on the GPU: aotc's fused
kernel (aotc/kernels/fused_gemv.py), the same computation as Inductor compiles it without aotc's
pass (its norm or activation kernel, cuBLAS, its residual kernel), and cuBLAS's product alone (the
part of the unfused form that reads the weight).

Each form runs `--layers` calls on distinct weights (as many layers as a model has, so the weights
are read from memory, not from L2) inside one CUDA graph; the graph is replayed `--replays` times
and the median per call is reported, with the weight's read at that time as a fraction of the copy
bandwidth measured in the same run (aotc.bench.generation.copy_bandwidth).

    python scripts/fused_gemv.py --out fused_gemv.json
    python scripts/fused_gemv.py --shapes 576x960:norm,1536x576:gated+residual --rows 1,8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotc.bench.generation import copy_bandwidth  # noqa: E402
from aotc.export.fused_products import reference  # noqa: E402
from aotc.kernels.fused_gemv import fused_gemv  # noqa: E402
from aotc.kernels.graph_timing import replay_seconds  # noqa: E402

# SmolLM2-135M's and Llama-3.2-1B's products (K x N) and what each takes in, and their output layers
SHAPES = (
    "576x960:norm,576x576:residual,576x3072:norm,1536x576:gated+residual,576x49152:norm,"
    "2048x3072:norm,2048x2048:residual,2048x16384:norm,8192x2048:gated+residual"
)


def graph_time(calls, replays: int) -> float:
    """Median seconds per call of `calls` (closures) captured into one CUDA graph."""

    def step() -> None:
        for call in calls:
            call()

    return statistics.median(replay_seconds(step, replays)) / len(calls)


def measure(
    k_in: int, n_out: int, form: str, rows: int, layers: int, replays: int, dtype, sweep=(),
    int4_group: int = 0, one_byte: bool = False,
):  # fmt: skip
    device = "cuda"
    norm, gated, residual = "norm" in form, "gated" in form, "residual" in form
    clamp = torch.finfo(dtype).max if dtype != torch.float32 else 0.0
    weights = [
        torch.randn(n_out, k_in, device=device, dtype=dtype) / k_in**0.5 for _ in range(layers)
    ]
    x = torch.randn(rows, 2 * k_in if gated else k_in, device=device)
    x = x if norm else x.to(dtype)
    nw = torch.ones(k_in, device=device, dtype=dtype) if norm else None
    r = torch.randn(rows, n_out, device=device) if residual else None
    unfused = torch.compile(reference, dynamic=False)
    plain_x = torch.randn(rows, k_in, device=device, dtype=dtype)
    forms = {
        "fused": [lambda w=w: fused_gemv(x, w, None, nw, r, 1e-5, gated, clamp) for w in weights],
        "inductor": [lambda w=w: unfused(x, w, None, nw, r, 1e-5, gated, clamp) for w in weights],
        "cublas_product": [lambda w=w: torch.nn.functional.linear(plain_x, w) for w in weights],
    }
    if int4_group:  # the same products over int4 groups: aotc's kernel, and tinygemm's alone
        from aotc.export.quantized_linear import int4_groups, int4_tinygemm, int4_tinygemm_mm
        from aotc.kernels.fused_gemv import fused_int4_gemv

        groups = [int4_groups(w, int4_group, dtype) for w in weights]
        tiles = [int4_tinygemm(w, int4_group) for w in weights]
        forms["fused_int4"] = [
            lambda p=p, sz=sz: fused_int4_gemv(
                x, p, sz, int4_group, None, nw, r, 1e-5, gated, clamp, dtype
            )
            for p, sz in groups
        ]
        forms["tinygemm_product"] = [
            lambda t=t, sz=sz: int4_tinygemm_mm(plain_x, t, sz, int4_group) for t, sz in tiles
        ]
    if one_byte:  # the same products over int8 rows and fp8 blocks: aotc's kernel
        from aotc.export.quantized_linear import fp8_blocks, int8_rows

        for name, quantize in (("int8", lambda w: int8_rows(w, dtype)), ("fp8", fp8_blocks)):
            stored = [quantize(w.float()) for w in weights]
            forms[f"fused_{name}"] = [
                lambda q=q, s=s: fused_gemv(
                    x, q, None, nw, r, 1e-5, gated, clamp, scale=s, operand_dtype=dtype
                )
                for q, s in stored
            ]
    for block_n, block_k, warps in sweep:
        forms[f"fused {block_n}x{block_k}/{warps}w"] = [
            lambda w=w, c=(block_n, block_k, warps): fused_gemv(
                x, w, None, nw, r, 1e-5, gated, clamp, shape=c
            )
            for w in weights
        ]
    seconds = {name: graph_time(calls, replays) for name, calls in forms.items()}
    return seconds, weights[0].numel() * weights[0].element_size()


def sweep_shapes(k_in: int) -> list:
    """(BLOCK_N, BLOCK_K, warps) around launch_shape's rule, for --sweep."""
    blocks_k = [b for b in (256, 512, 1024, 2048) if b <= max(256, 2 * k_in)]
    return [(n, k, w) for n in (1, 2, 4, 8, 16) for k in blocks_k for w in (2, 4, 8)
            if n * k <= 32768]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", default=SHAPES, help="KxN:form,... (form: norm, residual, gated+residual)"
    )
    parser.add_argument("--rows", default="1")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--int4",
        type=int,
        default=0,
        metavar="GROUP",
        help="also time the products over int4 groups of GROUP: aotc's fused kernel and tinygemm",
    )
    parser.add_argument(
        "--one-byte",
        action="store_true",
        help="also time aotc's fused kernel over int8 rows and fp8 blocks of the same weights",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="also time the fused kernel's launch shapes around its rule",
    )
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    records = []
    for item in args.shapes.split(","):
        shape, form = item.split(":")
        k_in, n_out = map(int, shape.split("x"))
        for rows in map(int, args.rows.split(",")):
            # the output layer is one product a step: fewer copies keep its memory in bounds
            layers = 4 if n_out > 20000 else args.layers
            sweep = sweep_shapes(k_in) if args.sweep else ()
            seconds, nbytes = measure(
                k_in,
                n_out,
                form,
                rows,
                layers,
                args.replays,
                dtype,
                sweep,
                args.int4,
                args.one_byte,
            )
            floor = nbytes / bandwidth
            record = {"k": k_in, "n": n_out, "form": form, "rows": rows, "bytes": nbytes,
                      "floor_us": floor * 1e6,
                      **{f"{name}_us": s * 1e6 for name, s in seconds.items()}}  # fmt: skip
            records.append(record)
            if sweep:
                swept = sorted(
                    (s, name) for name, s in seconds.items() if name.startswith("fused ")
                )
                print(
                    "  best launch shapes: "
                    + ", ".join(f"{n} {t * 1e6:.2f} us" for t, n in swept[:3])
                )
            print(
                f"{k_in}x{n_out} {form:16s} rows {rows:2d}: fused {seconds['fused'] * 1e6:6.2f} us "
                f"({floor / seconds['fused']:.2f} of floor), inductor {seconds['inductor'] * 1e6:6.2f}, "
                f"cuBLAS product alone {seconds['cublas_product'] * 1e6:6.2f}"
            )
            if args.int4:  # 4 bits a weight, and a bf16 scale and zero a group
                int4_bytes = k_in * n_out // 2 + 4 * (k_in // args.int4) * n_out
                record["int4_bytes"] = int4_bytes
                print(
                    f"  int4 g{args.int4}: fused {seconds['fused_int4'] * 1e6:6.2f} us "
                    f"({int4_bytes / bandwidth / seconds['fused_int4']:.2f} of its floor), "
                    f"tinygemm product alone {seconds['tinygemm_product'] * 1e6:6.2f}"
                )
            if args.one_byte:  # a byte a weight; the scales (a row's, a block's) left out
                for name in ("int8", "fp8"):
                    one_byte_floor = k_in * n_out / bandwidth
                    print(
                        f"  {name}: fused {seconds[f'fused_{name}'] * 1e6:6.2f} us "
                        f"({one_byte_floor / seconds[f'fused_{name}']:.2f} of its floor)"
                    )
    if args.out:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "copy_bandwidth_tb_s": bandwidth / 1e12, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "records": records}, indent=1))


if __name__ == "__main__":
    main()
