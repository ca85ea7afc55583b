"""The stored forms of quantized weights and the products that read them.

Each scheme has a packer (float weight -> the tensors a package stores) and a product (activations
and those tensors -> what `F.linear` with the float weight gives). The packers run at build time;
the products are plain PyTorch that the quantization pass (quantization.py) puts into the graph,
so AOTInductor compiles them like the rest of the model. The same packers dequantize for the
build's reference (`dequantized`), so the check compares the package with exactly the weights it
stores.

Kernel choices, measured with scripts/quantized_gemv.py (docs/quantization.md):
- CPU, decode (a few rows): a product written as multiply-and-sum over the input features, which
  Inductor compiles to one vectorized reduction that reads the int8 or int4 bytes once and
  converts them in registers: 3-4x faster than the fp32 product at one row on the 2-core VM,
  where torch's `_weight_int8pack_mm` and CPU int4 kernel were 3-7x slower than fp32.
- CPU, prefill (many rows): the weight dequantized once per call, then a dense product. The two
  are one `torch.cond` on the row count, which AOTInductor compiles to both kernels and a branch;
  where the row count is fixed at export, the branch is chosen then.
- CUDA int8 and fp8: a Triton GEMV over the stored bytes (aotc/kernels/gemv.py) for every row count.
  Inductor's own reduction reached 1.1-2.0 TB/s of int8 and `_weight_int8pack_mm` 0.1-0.2 TB/s;
  `torch._scaled_mm` with per-row fp8 activations took 9.5 us where bf16 took 5 at one row, so
  fp8 on CUDA stores fp8 weights and keeps the activations in the base precision.
- CUDA int4: torch's tinygemm (`_weight_int4pack_mm`, bf16 only), the kernel torchao's int4
  layout uses: 2.3x faster than bf16 on a 2048x16384 product at one row on the H100.
"""

from __future__ import annotations

from aotc.quantize_schemes import fp8_block_size

# Products with at most this many rows take the reduction form (the decode side of torch.cond).
DECODE_ROWS = 8
INT8_MAX = 127.0
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def int8_rows(w, dtype):
    """(int8 [N, K], scale [N] in `dtype`): symmetric per output row, scale = max |w| / 127."""
    import torch

    w = w.float()
    scale = (w.abs().amax(dim=1) / INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    scale = scale.to(dtype)  # quantize with the scale the package stores
    q = torch.round(w / scale.float()[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def int8_rows_dequantized(q, scale):
    return q.float() * scale.float()[:, None]


def int8_rows_gemv(x, q, scale):
    """x [M, K] @ dequantized(q).T: one reduction over K, the weight read as int8, in x's dtype:
    the CPU's int8 output layer at decode (quantization.cpu_int8_output_linear)."""
    return (x.unsqueeze(-2) * q.to(x.dtype)).sum(-1) * scale


def int8_cpu_mm(x, q, scale):
    """x [M, K] times the int8 weight on the CPU: torch's int8 kernel (`_weight_int8pack_mm`), whose
    fast path takes bf16 activations and bf16 scales and gives a bf16 product. On the 2-core VM at
    SmolLM2's shapes it took half the time of Inductor's reduction over the bytes at one row
    (10.5 against 23.8 us for 960 x 576), and a fifth of it or less at 32; with fp32 activations
    it is 5-20x slower than either. `scale` is bf16 already (Forms.pack), so the package multiplies
    exactly the weights it stores."""
    import torch

    out = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), q, scale.to(torch.bfloat16))
    return out.to(x.dtype)


def int4_grid(w, group: int, dtype):
    """(scale, zero), each [N, K/group] in `dtype`: 16 levels between each group's min and max,
    w = (q - 8) * scale + zero (tinygemm's convention)."""
    n, k = w.shape
    wg = w.float().reshape(n, k // group, group)
    return _range_grid(wg.amin(dim=-1), wg.amax(dim=-1), dtype)


def _range_grid(lo, hi, dtype):
    """(scale, zero) in `dtype` of 16 levels from `lo` to `hi`: w = (q - 8) * scale + zero."""
    scale = ((hi - lo) / 15).clamp(min=1e-8).to(dtype)
    return scale, (lo + 8 * scale.float()).to(dtype)


CLIP_FACTORS = tuple(1 - 0.02 * i for i in range(1, 21))  # a group's range kept: 98% to 60%
CLIP_ROWS = 4096  # output features searched at once (bounds the search's memory)


def int4_grid_weighted(w, group: int, dtype, importance):
    """(scale, zero) as int4_grid's, each group's range clipped where that lowers the group's
    squared error weighted by each input feature's `importance` [K] (a calibration's sum of
    squared activations: the error a feature's weight makes in the layer's output grows with it).
    The range is tried whole, and shrunk from both ends, from below and from above, to each of
    CLIP_FACTORS; each candidate is scored with its scale and zero rounded to `dtype`, as stored.
    The idea of AWQ's clip search (Lin et al., 2024) on the activations' diagonal alone. On
    SmolLM2-135M-Instruct at group 64 it took a GPTQ package's perplexity increase from +16.8%
    to +4.0% (docs/quantization.md)."""
    import torch

    n, k = w.shape
    scales, zeros = [], []
    weights = importance.float().reshape(1, k // group, group)
    for r0 in range(0, n, CLIP_ROWS):
        wg = w[r0 : r0 + CLIP_ROWS].float().reshape(-1, k // group, group)
        lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
        best = None
        for below, above in [(1.0, 1.0)] + [
            pair for f in CLIP_FACTORS for pair in ((f, f), (1.0, f), (f, 1.0))
        ]:
            scale, zero = _range_grid(lo * below, hi * above, dtype)
            q = int4_levels_on(wg.reshape(-1, k), scale, zero).reshape(wg.shape)
            s, z = scale.float()[..., None], zero.float()[..., None]
            error = (((q - 8) * s + z - wg) ** 2 * weights).sum(dim=-1)
            if best is None:
                best = [error, scale, zero]
            else:
                better = error < best[0]
                best = [
                    torch.where(better, new, old) for new, old in zip((error, scale, zero), best)
                ]
        scales.append(best[1])
        zeros.append(best[2])
    return torch.cat(scales), torch.cat(zeros)


def int4_levels_on(w, scale, zero):
    """Each weight's level (0-15, float) on the groups' grid: w [N, K], scale and zero [N, K/group]."""
    import torch

    n, k = w.shape
    wg = w.float().reshape(n, scale.shape[1], -1)
    q = torch.round((wg - zero.float()[..., None]) / scale.float()[..., None] + 8).clamp(0, 15)
    return q.reshape(n, k)


def int4_groups(w, group: int, dtype, levels=None):
    """(uint8 [N, K/2], scale_zero [N, K/group, 2] in `dtype`): asymmetric per group of `group` input
    features, w rounded to int4_grid's levels; or `levels` (levels [N, K] 0-15, scale, zero) as a
    calibrated method (gptq.py) chose them. A group's first half sits in the low nibbles of its
    bytes, its second half in the high ones, so the product reads the activations in two
    contiguous runs per group."""
    import torch

    n, k = w.shape
    if levels is None:
        scale, zero = int4_grid(w, group, dtype)
        q = int4_levels_on(w, scale, zero)
    else:
        q, scale, zero = levels[0], levels[1].to(dtype), levels[2].to(dtype)
    q = q.to(torch.uint8).reshape(n, k // group, 2, group // 2)
    packed = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
    return packed, torch.stack([scale, zero], dim=-1).contiguous()


def _int4_halves(packed, scale_zero, group: int, dtype):
    """The dequantized weight as its low- and high-nibble halves, each [N, K/group, group/2]."""
    n = packed.shape[0]
    halves = []
    for nibbles in (packed & 15, packed >> 4):
        q = nibbles.reshape(n, -1, group // 2).to(dtype)
        halves.append((q - 8) * scale_zero[..., 0:1].to(dtype) + scale_zero[..., 1:2].to(dtype))
    return halves


def int4_groups_dequantized(packed, scale_zero, group: int, dtype=None):
    import torch

    dtype = dtype or torch.float32
    low, high = _int4_halves(packed, scale_zero, group, dtype)
    return torch.stack([low, high], dim=2).reshape(packed.shape[0], -1)


def int4_groups_gemv(x, packed, scale_zero, group: int):
    """Inductor's reduction over the nibbles (the CPU's int4 product before torch's int4 kernel;
    scripts/quantized_gemv.py still times it)."""
    m, k = x.shape
    xg = x.reshape(m, 1, k // group, 2, group // 2)
    low, high = _int4_halves(packed, scale_zero, group, x.dtype)
    return (xg[..., 0, :] * low + xg[..., 1, :] * high).sum(-1).sum(-1)


def _int4_levels(packed, group: int):
    """int4_groups' packed nibbles as one level (0-15) per weight [N, K], in input-feature order."""
    import torch

    n, half = packed.shape
    halves = packed.reshape(n, 2 * half // group, group // 2)
    return torch.stack([halves & 15, halves >> 4], dim=2).reshape(n, 2 * half)


def _inner_tiles(k_in: int) -> int:
    """The inner-K tiles torch's int4 layouts take: the most of 8, 4, 2 whose 16-wide blocks
    divide the input features."""
    return next(t for t in (8, 4, 2) if k_in % (t * 16) == 0)


def int4_tinygemm(w, group: int, levels=None):
    """(packed int32, scale_zero [K/group, N, 2] bf16) for torch's CUDA int4 kernel: the same
    quantized values as int4_groups, in the tiled layout `_convert_weight_to_int4pack` makes."""
    import torch

    packed, scale_zero = int4_groups(w, group, torch.bfloat16, levels)
    q = _int4_levels(packed, group)
    pairs = ((q[:, 0::2] << 4) | q[:, 1::2]).to(torch.uint8)  # tinygemm's byte order
    tinygemm = torch.ops.aten._convert_weight_to_int4pack(
        pairs.contiguous(), _inner_tiles(w.shape[1])
    )
    return tinygemm, scale_zero.transpose(0, 1).contiguous()


def int4_cpu_tiles(packed, scale_zero):
    """(uint8 tiles, scale_zero [K/group, N, 2] bf16) for torch's CPU int4 kernel
    (`_weight_int4pack_mm_for_cpu`): the values int4_groups packed, in the layout
    `_convert_weight_to_int4pack_for_cpu` makes. The groups' scales and zeros must be bf16 already
    (the kernel takes them so), so that the package multiplies exactly the weights it stores."""
    import torch

    k = 2 * packed.shape[1]
    q = _int4_levels(packed, k // scale_zero.shape[1]).to(torch.int32)
    cpu = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), _inner_tiles(k))
    return cpu, scale_zero.to(torch.bfloat16).transpose(0, 1).contiguous()


def int4_cpu_mm(x, tiles, scale_zero, group: int):
    """x [M, K] times the int4 weight on the CPU: torch's int4 kernel, whose fast path takes bf16
    activations and gives a bf16 product (on the 2-core VM at one row of a 576 x 3072 product,
    about 3x faster than Inductor's reduction over nibbles; with fp32 activations 10x slower)."""
    import torch

    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), tiles, group, scale_zero)
    return out.to(x.dtype)


def int4_tinygemm_mm(x, packed, scale_zero, group: int):
    import torch

    out = torch.ops.aten._weight_int4pack_mm(x.to(torch.bfloat16), packed, group, scale_zero)
    return out.to(x.dtype)


def fp8_blocks(w):
    """(float8_e4m3fn [N, K], scale [N, K / block] float32): a scale per output row and block of
    fp8_block_size(K) input features, scale = the block's max |w| / 448. Per row, one large
    weight flattened the rest of its row towards fp8's subnormals: SmolLM2-135M's perplexity rose
    4.7% with per-row scales and 1.6% with blocks of 64-128 (docs/quantization.md), the
    block-wise scaling DeepSeek-V3 and torchao's fp8 use."""
    import torch

    n, k = w.shape
    block = fp8_block_size(k)
    wb = w.float().reshape(n, k // block, block)
    scale = (wb.abs().amax(dim=-1) / FP8_MAX).clamp(min=1e-12)
    q = (wb / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(n, k), scale


def fp8_blocks_dequantized(q, scale):
    n, k = q.shape
    blocks = scale.shape[1]
    return (q.float().reshape(n, blocks, k // blocks) * scale[..., None]).reshape(n, k)


def fp8_rows(w):
    """(float8_e4m3fn [N, K], scale [N] float32): per output row, scale = max |w| / 448."""
    import torch

    w = w.float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=1e-12)
    q = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def fp8_rows_dequantized(q, scale):
    return q.float() * scale[:, None]


def fp8_activations(x):
    """(float8 [M, K], scale [M, 1] float32): each row of activations scaled to fp8's range."""
    import torch

    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def fp8_scaled_mm(x, q, scale):
    """Both operands in fp8, per-row scales on each side, accumulated in fp32 (cuBLAS on Hopper)."""
    import torch

    xq, x_scale = fp8_activations(x)
    out = torch._scaled_mm(
        xq, q.t(), scale_a=x_scale, scale_b=scale[None, :], out_dtype=torch.bfloat16
    )
    return out.to(x.dtype)


def int8_activations(x):
    """(int8 [M, K], scale [M, 1]): each row of activations symmetric in 127 levels."""
    import torch

    scale = (x.abs().amax(dim=-1, keepdim=True).float() / INT8_MAX).clamp(min=1e-12)
    return torch.round(x.float() / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def int8_dynamic_mm(x, q_t, scale):
    """int8 x int8 -> int32 (oneDNN's VNNI kernels on x86), both sides' scales after."""
    import torch

    xq, x_scale = int8_activations(x)
    return (torch._int_mm(xq, q_t).float() * x_scale * scale.float()).to(x.dtype)


def int8_dynamic_emulated(x, q_t, scale):
    import torch

    xq, x_scale = int8_activations(x)
    return torch.nn.functional.linear(
        xq.float() * x_scale, q_t.t().float() * scale.float()[:, None]
    ).to(x.dtype)
