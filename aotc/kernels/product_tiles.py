"""Tiles of aotc's fused products chosen at build, by timing them on the GPU the package is built
on: the idea of `aotc build --tune`, applied to the kernels aotc writes itself.

fused_gemv.launch_shape is a rule fitted to sweeps on an H200 (scripts/fused_gemv.py --sweep). A
build with `--fused-products` times, for each distinct float weight shape of the step, the rule's
tile and its neighbours (half and twice the output features a program takes, half the input
features a block holds, 4 or 8 warps), and keeps a neighbour only where it beats the rule's tile by
more than MARGIN (timing noise otherwise decides). The choice is in force while AOTInductor compiles
the package (tiles_in_force: the kernel's grid and constexprs are fixed as it is traced) and is
recorded in the manifest with the GPU it was made on. The runtimes run such a package on any GPU of
the same architecture, correctly, and say once that its tiles were chosen on another GPU.

The timed form is the plain product of one row (no norm, activation or residual; those change
what each program does before and after its loop, not the loop the tile sizes), each call on its
own weights in one CUDA graph, so that the weights come from memory, as in a decode step. int8,
fp8 and int4 weights keep the launch rules.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from aotc.kernels.graph_timing import replay_seconds

Key = tuple[int, int, str]  # (output features, input features, the weight's dtype)
Tile = tuple[int, int, int]  # (BLOCK_N, BLOCK_K, warps): fused_gemv's `shape`
MARGIN = 0.03  # a neighbour replaces the rule's tile only if it is this much faster
WEIGHT_BYTES_TIMED = 256 << 20  # weights a timed graph reads: several times any GPU's L2
REPLAYS = 20

_IN_FORCE: dict[Key, Tile] = {}


def key_of(n_out: int, k_in: int, dtype: torch.dtype) -> Key:
    return (n_out, k_in, str(dtype).removeprefix("torch."))


def label(key: Key) -> str:
    """The manifest's name for a key: "576x960 bfloat16" (output x input features)."""
    n_out, k_in, dtype = key
    return f"{n_out}x{k_in} {dtype}"


def tile_in_force(n_out: int, k_in: int, dtype: torch.dtype) -> Tile | None:
    """The tile chosen for this weight shape by the build compiling now, if any."""
    return _IN_FORCE.get(key_of(n_out, k_in, dtype))


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


def candidates(n_out: int, k_in: int, rule: Tile) -> list[Tile]:
    """The rule's tile first, then its neighbours that keep at most 16K weight elements a program
    (fused_gemv.launch_shape's register bound) and a block of input features of at least 128."""
    block_n, block_k, _warps = rule
    found = [rule]
    for n in (block_n // 2, block_n, block_n * 2):
        for k in (block_k // 2, block_k):
            for warps in (4, 8):
                tile = (n, k, warps)
                if n >= 1 and k >= 128 and n * k <= 16384 and n <= n_out and tile not in found:
                    found.append(tile)
    return found


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
        seconds = {
            tile: _timed(seconds_of, key, tile, rule) for tile in candidates(key[0], key[1], rule)
        }
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


def seconds_on_gpu(key: Key, tile: Tile, device: torch.device, product: Callable) -> float:
    """Median seconds of one plain `product` (fused_gemv.fused_gemv, passed in: it reads this
    module's table) of one row with `tile`, on weights of `key`'s shape read from memory (a CUDA
    graph of calls on distinct weights, replayed)."""
    n_out, k_in, dtype_name = key
    dtype = getattr(torch, dtype_name)
    size = n_out * k_in * dtype.itemsize
    layers = max(2, min(64, WEIGHT_BYTES_TIMED // size))
    generator = torch.Generator(device=device).manual_seed(0)
    weights = [
        torch.randn(n_out, k_in, device=device, dtype=dtype, generator=generator)
        for _ in range(layers)
    ]
    x = torch.randn(1, k_in, device=device, dtype=dtype, generator=generator)

    def step() -> None:
        for weight in weights:
            product(x, weight, None, None, None, 0.0, False, 0.0, shape=tile)

    return statistics.median(replay_seconds(step, REPLAYS, device)) / layers


def fused_product_keys(module: torch.fx.GraphModule) -> list[Key]:
    """The distinct float weight shapes of `module`'s fused products (its subgraphs' too: a
    product's row-count branch is a cond), in the order met. The product's op is registered by
    whoever put it in the graph (fused_gemv.py)."""
    op = torch.ops.aotc.fused_gemv_cuda.default
    keys: dict[Key, None] = {}
    for graph_module in module.modules():
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target is not op:
                continue
            weight, scale = node.args[1], node.args[8]
            if scale is not None:  # int8 or fp8: the launch rule
                continue
            val = weight.meta.get("val")
            if isinstance(val, torch.Tensor):
                keys[key_of(val.shape[0], val.shape[1], val.dtype)] = None
    return list(keys)
