"""Tiles of aotc's fused products chosen at build, by timing them on the GPU the package is built
on: the idea of `aotc build --tune`, applied to the kernels aotc writes itself.

fused_gemv.launch_shape and int4_launch_shape (tile_timing.rule_for) are rules fitted to sweeps
on an H200 (scripts/fused_gemv.py --sweep). A build with `--fused-products` times, for each
distinct weight shape and form of the step (bf16 or fp32, int8 rows, fp8 blocks, int4 groups), the
rule's tile and its neighbours (half and twice the output features a program takes, half or twice the input
features a block holds, 4 or 8 warps), and keeps a neighbour only where it beats the rule's tile by
more than MARGIN (timing noise otherwise decides). A weight of one byte an element may take twice
the elements a program: the same bytes in flight, which is what a product at batch 1 waits on. The
choice is in force while AOTInductor compiles the package (tiles_in_force: the kernel's grid and
constexprs are fixed as it is traced) and is recorded in the manifest with the GPU it was made on.
The runtimes run such a package on any GPU of the same architecture, correctly, and say once that
its tiles were chosen on another GPU.

Each product is timed (tile_timing.py, which runs the kernels; this module only decides) in the
form the step has it, one row: with its norm, gated activation and residual, which each program
computes again for its tile (timed plain, the int4 kernel's choices ran at a third of their speed
in the step).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

# (output features, input features, the weight's form: its dtype's name or "int4g<group>", what
# the product takes in and adds: "norm", "gated+residual", "plain"...)
Key = tuple[int, int, str, str]
# fused_gemv's (BLOCK_N, BLOCK_K, warps) or fused_int4_gemv's (BLOCK_N, BLOCK_G, warps)
Tile = tuple[int, int, int]
# the rows a fused product takes at most (fused_gemv.py's kernels); more take the unfused program:
# each row's program reads the weight again (from L2) and, for int4, dequantizes it again
MAX_ROWS = 4
MARGIN = 0.03  # a neighbour replaces the rule's tile only if it is this much faster
ELEMENTS = 16384  # a float tile's weights a program holds: 64 fp32 registers a thread at 8 warps
INT4_TILE_BYTES = 16384  # packed bytes an int4 tile holds
ONE_BYTE_FORMS = ("int8", "float8_e4m3fn")

_IN_FORCE: dict[Key, Tile] = {}


def key_of(n_out: int, k_in: int, form: torch.dtype | str, around: str) -> Key:
    """`form`: the weight's dtype, or "int4g<group>" for int4 groups; `around`: surroundings()."""
    return (n_out, k_in, str(form).removeprefix("torch."), around)


def surroundings(norm: bool, gated: bool, residual: bool) -> str:
    """What a fused product takes in and adds, as its key names it: "norm+residual", "plain"."""
    parts = [name for name, on in (("norm", norm), ("gated", gated), ("residual", residual)) if on]
    return "+".join(parts) or "plain"


def int4_group(key: Key) -> int:
    """The group of an int4 key's weights (0: not int4 groups)."""
    return int(key[2].removeprefix("int4g")) if key[2].startswith("int4g") else 0


def label(key: Key) -> str:
    """The manifest's name for a key: "576x960 bfloat16 norm" (output x input features)."""
    n_out, k_in, form, around = key
    return f"{n_out}x{k_in} {form} {around}"


def tile_in_force(n_out: int, k_in: int, form: torch.dtype | str, around: str) -> Tile | None:
    """The tile chosen for this product by the build compiling now, if any."""
    return _IN_FORCE.get(key_of(n_out, k_in, form, around))


@contextlib.contextmanager
def tiles_in_force(table: dict[Key, Tile]) -> Iterator[None]:
    """`table` consulted by fused_gemv while the block runs (AOTInductor traces the kernels'
    launches during the compile inside it)."""
    saved = dict(_IN_FORCE)
    _IN_FORCE.clear()
    _IN_FORCE.update(table)
    try:
        yield
    finally:
        _IN_FORCE.clear()
        _IN_FORCE.update(saved)


def _neighbours(rule: Tile, fits: Callable[[int, int], bool]) -> list[Tile]:
    """The rule's tile first, then its neighbours (half and twice each of its two sizes, 4 or 8
    warps) whose sizes `fits`."""
    first, second, _warps = rule
    found = [rule]
    for a in (first // 2, first, first * 2):
        for b in (second // 2, second, second * 2):
            for warps in (4, 8):
                if (a, b, warps) not in found and fits(a, b):
                    found.append((a, b, warps))
    return found


def candidates(n_out: int, k_in: int, rule: Tile, elements: int = ELEMENTS) -> list[Tile]:
    """fused_gemv's: the rule's tile and its neighbours that keep at most `elements` weight
    elements a program (launch_shape's register bound) and a block of input features from 128 to
    the row's length rounded up to a power of two."""
    longest = max(rule[1], 1 << max(0, k_in - 1).bit_length())
    return _neighbours(
        rule, lambda n, k: 1 <= n <= n_out and 128 <= k <= longest and n * k <= elements
    )


def int4_candidates(n_out: int, k_in: int, group: int, rule: Tile) -> list[Tile]:
    """fused_int4_gemv's: the rule's tile and its neighbours of at most INT4_TILE_BYTES packed
    bytes and at most the row's groups rounded up to a power of two."""
    most_groups = 1 << max(0, k_in // group - 1).bit_length()

    def fits(n: int, g: int) -> bool:
        return 1 <= n <= n_out and 1 <= g <= most_groups and n * g * group // 2 <= INT4_TILE_BYTES

    return _neighbours(rule, fits)


def candidates_for(key: Key, rule: Tile) -> list[Tile]:
    """The tiles timed for `key`: a weight of one byte an element may hold twice the elements."""
    n_out, k_in, form, _around = key
    group = int4_group(key)
    if group:
        return int4_candidates(n_out, k_in, group, rule)
    return candidates(n_out, k_in, rule, 2 * ELEMENTS if form in ONE_BYTE_FORMS else ELEMENTS)


def choose(
    keys: Iterable[Key],
    rule_of: Callable[[Key], Tile],
    seconds_of: Callable[[Key, Tile], float],
    margin: float = MARGIN,
) -> tuple[dict[Key, Tile], dict[str, dict[str, Any]]]:
    """(key -> tile, the manifest's record: label -> {tile, µs, rule's µs}) for `keys`, each
    candidate timed by `seconds_of`."""
    table: dict[Key, Tile] = {}
    record: dict[str, dict[str, Any]] = {}
    for key in keys:
        rule = rule_of(key)
        seconds = {tile: _timed(seconds_of, key, tile, rule) for tile in candidates_for(key, rule)}
        best = min(seconds, key=seconds.__getitem__)
        chosen = best if seconds[best] < seconds[rule] * (1 - margin) else rule
        table[key] = chosen
        record[label(key)] = {
            "tile": list(chosen),
            "us": round(seconds[chosen] * 1e6, 2),
            "rule_us": round(seconds[rule] * 1e6, 2),
        }
    return table, record


def _timed(seconds_of: Callable[[Key, Tile], float], key: Key, tile: Tile, rule: Tile) -> float:
    """seconds_of(key, tile); a neighbour that fails to compile or launch is no candidate (inf),
    the rule's tile (what the package would use anyway) fails the build."""
    if tile == rule:
        return seconds_of(key, tile)
    try:
        return seconds_of(key, tile)
    except Exception:  # e.g. Triton out of resources for this GPU
        return math.inf


def fused_product_keys(module: torch.fx.GraphModule) -> list[Key]:
    """The distinct weight shapes, forms and surroundings of `module`'s fused products (its
    subgraphs' too: a product's row-count branch is a cond), in the order met. The products' ops are registered by
    whoever put them in the graph (fused_gemv.py)."""
    dense = torch.ops.aotc.fused_gemv_cuda.default
    int4 = getattr(torch.ops.aotc, "fused_int4_gemv_cuda", None)
    keys: dict[Key, None] = {}
    for graph_module in module.modules():
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        for node in graph_module.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is dense:  # (x, weight, bias, norm, residual, eps, gated, ...)
                val = node.args[1].meta.get("val")
                around = surroundings(
                    node.args[3] is not None, node.args[6], node.args[4] is not None
                )
                if isinstance(val, torch.Tensor):
                    keys[key_of(val.shape[0], val.shape[1], val.dtype, around)] = None
            elif int4 is not None and node.target is int4.default:
                # (x, packed, scale_zero, group, bias, norm, residual, eps, gated, ...)
                val, group = node.args[1].meta.get("val"), node.args[3]
                around = surroundings(
                    node.args[5] is not None, node.args[8], node.args[6] is not None
                )
                if isinstance(val, torch.Tensor):
                    keys[key_of(val.shape[0], val.shape[1] * 2, f"int4g{group}", around)] = None
    return list(keys)
