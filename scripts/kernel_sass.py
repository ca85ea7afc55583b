"""What aotc's fused product kernels compile to on Hopper, without a GPU: each form compiled by
Triton to machine code (SASS, through the ptxas Triton ships) for compute capability 9.0, and the
instructions of its main loop counted by kind, per byte of weight a thread reads in one trip.

Device time is scarce; a kernel change can be weighed before it goes to the GPU. What it shows:
conversions the GPU runs at a quarter of its add rate (I2F), shuffles and shared-memory trips
(SHFL, LDS, BAR: a reduction or a layout conversion inside the loop), and the instructions a byte
costs. What it does not: memory latency, occupancy, how the loop overlaps its loads. The counts
are a guide to measure by (scripts/fused_gemv.py on the GPU), not a measurement.

Needs Triton (`make test-kernels` installs it into .triton-kernels):

    PYTHONPATH=.triton-kernels .venv/bin/python scripts/kernel_sass.py --weight int4 --tile 16,4,8
    PYTHONPATH=.triton-kernels .venv/bin/python scripts/kernel_sass.py --weight int8 --k 2048
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

WEIGHTS = {"bf16": "bf16", "fp32": "fp32", "int8": "i8", "fp8": "fp8e4nv", "int4": "u8"}
OPERANDS = {"bf16": 16, "fp32": 32}


def compiled(weight: str, k_in: int, tile: tuple, around: str, group: int):
    """Triton's compiled kernel of the fused product (aotc/kernels/fused_gemv.py) for Hopper."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from aotc.kernels import fused_gemv

    norm, gated, residual = (part in around.split("+") for part in ("norm", "gated", "residual"))
    block_n, block, warps = tile
    operand = "fp32" if weight == "fp32" else "bf16"
    common = {
        "x_ptr": "*fp32" if norm else f"*{operand}", "b_ptr": f"*{operand}",
        "norm_ptr": f"*{operand}", "res_ptr": "*fp32", "out_ptr": "*fp32", "n_out": "i32",
        "x_stride": "i32", "eps": "fp32", "clamp": "fp32",
    }  # fmt: skip
    flags = {"NORM": norm, "GATED": gated, "BIAS": False, "RESIDUAL": residual, "CLAMP": True,
             "OPERAND": OPERANDS[operand], "BLOCK_N": block_n, "PDL": True}  # fmt: skip
    if weight == "int4":
        kernel = fused_gemv.aotc_pdl_fused_int4_gemv
        signature = {"x_ptr": common["x_ptr"], "p_ptr": "*u8", "sz_ptr": f"*{operand}"}
        constants = {"K": k_in, "GROUP": group, "BLOCK_G": block, **flags}
    else:
        kernel = fused_gemv.aotc_pdl_fused_gemv
        signature = {"x_ptr": common["x_ptr"], "w_ptr": f"*{WEIGHTS[weight]}"}
        quantized = weight in ("int8", "fp8")
        constants = {"K": k_in, "SCALED": quantized, "BLOCK_K": block,
                     "SCALE_BLOCK": 128 if weight == "fp8" else 0, **flags}  # fmt: skip
        signature["scale_ptr"] = "*fp32" if weight == "fp8" else f"*{operand}"
    names = kernel.arg_names
    types = {**common, **signature}
    full = {name: types.get(name, "constexpr") for name in names}
    source = ASTSource(kernel, full, constexprs=constants)
    options = {"num_warps": warps, "num_stages": 1}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def sass_of(kernel) -> str:
    """The kernel's SASS, by the cuobjdump Triton ships beside its ptxas."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        return subprocess.run(
            [str(tool), "-sass", cubin.name], capture_output=True, text=True, check=True
        ).stdout


INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)[^;]*;")
BRANCH = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?BRA\s+0x([0-9a-f]+)")


def main_loop(sass: str) -> collections.Counter:
    """The instructions of the kernel's longest loop (from a branch's target to the branch back
    to it), counted by opcode (without modifiers)."""
    loops = [
        (int(target, 16), int(at, 16))
        for at, target in BRANCH.findall(sass)
        if int(target, 16) < int(at, 16)
    ]
    if not loops:
        return collections.Counter()
    start, end = max(loops, key=lambda span: span[1] - span[0])
    return collections.Counter(
        op for at, op in INSTRUCTION.findall(sass) if start <= int(at, 16) <= end
    )


def weight_bytes_a_thread(weight: str, tile: tuple, group: int) -> float:
    """Bytes of weight a thread reads in one trip of the main loop."""
    block_n, block, warps = tile
    if weight == "int4":
        tile_bytes = block_n * block * group // 2
    else:
        tile_bytes = block_n * block * {"bf16": 2, "fp32": 4, "int8": 1, "fp8": 1}[weight]
    return tile_bytes / (32 * warps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weight", choices=sorted(WEIGHTS), default="bf16")
    parser.add_argument("--k", type=int, default=2048, help="input features (K)")
    parser.add_argument(
        "--tile",
        default="8,1024,8",
        help="BLOCK_N,BLOCK_K,warps (int4: BLOCK_N,BLOCK_G,warps); the loop runs when K > BLOCK",
    )
    parser.add_argument("--around", default="norm", help="norm, gated+residual, residual, plain")
    parser.add_argument("--group", type=int, default=128, help="int4's group")
    args = parser.parse_args()
    tile = tuple(int(v) for v in args.tile.split(","))
    loop = main_loop(sass_of(compiled(args.weight, args.k, tile, args.around, args.group)))
    if not loop:
        sys.exit("no loop in the kernel: make K larger than the tile's block")
    per_byte = sum(loop.values()) / weight_bytes_a_thread(args.weight, tile, args.group)
    print(f"{args.weight} {args.around} K={args.k} tile {tile}: main loop {sum(loop.values())} "
          f"instructions, {per_byte:.1f} a byte of weight a thread reads")  # fmt: skip
    print("  " + ", ".join(f"{op} {count}" for op, count in loop.most_common(14)))


if __name__ == "__main__":
    main()
