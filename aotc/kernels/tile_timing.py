"""The timing behind the build's choice of fused product tiles (product_tiles.py): each candidate
tile run on the GPU the package is built on, in the form the step has the product (its norm,
gated activation and residual, each computed again by every program for its tile), each call on
its own weights in one CUDA graph, so that the weights come from memory, as in a decode step. A
quantized weight's product is timed with bf16 activations, what a bf16 build casts them to.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

import torch

from aotc.kernels.fused_gemv import fused_gemv, fused_int4_gemv, int4_launch_shape, launch_shape
from aotc.kernels.graph_timing import replay_seconds
from aotc.kernels.product_tiles import ONE_BYTE_FORMS, Key, Tile, int4_group
from aotc.quantize_schemes import fp8_block_size

WEIGHT_BYTES_TIMED = 256 << 20  # weights a timed graph reads: several times any GPU's L2
REPLAYS = 20


def rule_for(key: Key, programs_wanted: int) -> Tile:
    """The launch rule's tile for `key` (fused_gemv.py)."""
    group = int4_group(key)
    if group:
        return int4_launch_shape(key[0], key[1], group, programs_wanted)
    return launch_shape(key[0], key[1], programs_wanted)


def _products(key: Key, tile: Tile, device: torch.device, layers: int) -> list[Callable]:
    """`layers` products of one row with `tile` in `key`'s form, each on its own weights of
    `key`'s shape (random: the time does not depend on the values)."""
    n_out, k_in, form, around = key
    norm, gated, residual = (name in around.split("+") for name in ("norm", "gated", "residual"))
    group = int4_group(key)
    quantized = bool(group) or form in ONE_BYTE_FORMS
    operand = torch.bfloat16 if quantized else getattr(torch, form)
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=device, generator=generator).to(dtype)

    # a norm reads the fp32 residual stream (transformers' norm casts up), as does a residual add
    x = randn(1, 2 * k_in if gated else k_in, dtype=torch.float32 if norm else operand)
    norm_weight = torch.ones(k_in, device=device, dtype=operand) if norm else None
    added = randn(1, n_out) if residual else None
    products: list[Callable] = []
    for _ in range(layers):
        if group:
            packed = torch.randint(
                0, 256, (n_out, k_in // 2), device=device, dtype=torch.uint8, generator=generator
            )
            scale_zero = torch.rand(n_out, k_in // group, 2, device=device, dtype=operand)
            products.append(functools.partial(
                fused_int4_gemv, x, packed, scale_zero, group, None, norm_weight, added, 1e-5,
                gated, 0.0, operand, shape=tile,
            ))  # fmt: skip
            continue
        weight = randn(n_out, k_in)
        scale = None
        if form == "int8":
            weight = weight.mul(40).round().clamp(-127, 127).to(torch.int8)
            scale = torch.rand(n_out, device=device, dtype=operand)
        elif form == "float8_e4m3fn":
            weight = weight.to(torch.float8_e4m3fn)
            scale = torch.rand(n_out, k_in // fp8_block_size(k_in), device=device)
        else:
            weight = weight.to(operand)
        products.append(functools.partial(
            fused_gemv, x, weight, None, norm_weight, added, 1e-5, gated, 0.0, shape=tile,
            scale=scale, operand_dtype=operand if quantized else None,
        ))  # fmt: skip
    return products


def seconds_on_gpu(key: Key, tile: Tile, device: torch.device) -> float:
    """Median seconds of one fused product of one row with `tile`, in `key`'s form (its norm,
    gated activation, residual), on weights of `key`'s shape read from memory (a CUDA graph of
    calls on distinct weights, replayed)."""
    n_out, k_in, form, _around = key
    group = int4_group(key)
    weight_bytes = n_out * k_in // 2 if group else n_out * k_in * getattr(torch, form).itemsize
    layers = max(2, min(64, WEIGHT_BYTES_TIMED // weight_bytes))
    products = _products(key, tile, device, layers)

    def step() -> None:
        for product in products:
            product()

    return statistics.median(replay_seconds(step, REPLAYS, device)) / layers
