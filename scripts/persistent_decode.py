"""A persistent decode step, measured: how far one kernel for the whole step (the megakernels of
Hazy Research and Mirage's MPK) would take a batch-1 Llama-shaped decode past a kernel per product.

The prototype computes a decode step of a Llama shape (Llama-3.2-1B's by default) as five phases a
layer, then the output layer:
    1. the attention norm and the q/k/v product;
    2. decode attention of the 32 query heads over `--context` cached positions (grouped heads);
    3. the output product and its residual add;
    4. the MLP norm and the gate/up product;
    5. SiLU(gate)·up, the down product and its residual add;
    then the final norm and the output layer (the tied embedding).
The same Triton device code runs three ways, side by side in one process, each step captured into
one CUDA graph and replayed:
- `persistent`: one launch of `--programs-per-sm` programs per SM. A phase's tiles are dealt to the
  programs in turn, and the programs meet at a grid-wide barrier between phases: an atomic counter
  each program adds to and then waits on, as CUDA cooperative groups' grid.sync does. The last
  program out resets the counter, so a graph replays it as is.
- `per-phase`: the same phases, one launch each (the kernel boundary is the barrier), plain or with
  programmatic dependent launch (each kernel waits for its predecessor before its first read).
- `aotc`: aotc's own kernels as a package's fused step launches them (aotc/kernels/fused_gemv.py's
  products with their norms, activation and residuals, with PDL; the split attention of
  aotc/kernels/attention.py and its combine).
Also timed: the barriers alone (every phase empty), what the grid-wide barrier itself costs.

Left out of all three alike: rotary embeddings, the cache write and the sampler (in a megakernel
they are more phases or the attention phase's prologue). The figure is therefore the part of the
step that a persistent kernel changes: the products, the norms and attention, and the gaps between
them. The fraction of the copy floor is the weights' and the cache's bytes over the step's time,
against a device-to-device copy measured in the same run (aotc.bench.generation.copy_bandwidth).

    python scripts/persistent_decode.py --out persistent.json
    TRITON_INTERPRET=1 python scripts/persistent_decode.py --check-only --tiny   # the CPU check

A grid-wide barrier needs every program resident at once: the launch is at most a few programs an
SM, each small, and nothing else runs beside it. Triton's interpreter runs programs one after
another, so there the persistent form is checked with one program (a barrier that one program
passes at once) and the per-phase form with several.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aotc.kernels.programmatic import after_predecessor  # noqa: E402

# the phases of a layer, in order (the output layer is phase FINAL, once after the layers)
QKV, ATTENTION, OUTPUT, GATE_UP, DOWN, FINAL = range(6)
SPIN_LIMIT = tl.constexpr(1 << 20)  # polls before a barrier gives up (counted in counter[2])


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int

    @property
    def qkv(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


SHAPES = {
    "llama-1b": Shape(2048, 32, 8, 64, 8192, 16, 128256),
    "llama-8b": Shape(4096, 32, 8, 128, 14336, 32, 128256),
    "tiny": Shape(64, 4, 2, 16, 128, 2, 256),
}


@dataclass
class Step:
    """A step's weights (bf16, each kind stacked over the layers), its cache and its activations
    (fp32): the inputs every form reads and the buffers it writes."""

    shape: Shape
    context: int
    w_qkv: torch.Tensor  # [layers, qkv, hidden]
    w_o: torch.Tensor  # [layers, hidden, heads * head_dim]
    w_gate_up: torch.Tensor  # [layers, 2 * intermediate, hidden]
    w_down: torch.Tensor  # [layers, hidden, intermediate]
    norm_attention: torch.Tensor  # [layers, hidden]
    norm_mlp: torch.Tensor  # [layers, hidden]
    norm_final: torch.Tensor  # [hidden]
    w_out: torch.Tensor  # [vocab, hidden]
    keys: torch.Tensor  # [layers, max context + 1, kv_heads, head_dim] (slot max: never read)
    values: torch.Tensor
    x0: torch.Tensor  # the step's input, [hidden] fp32 (the residual stream)

    @staticmethod
    def random(shape: Shape, context: int, device: str, seed: int = 0) -> Step:
        """Random weights, drawn on `device` (an 8B shape's 16 GB would take minutes on a host)."""
        g = torch.Generator(device=device).manual_seed(seed)

        def weight(*size) -> torch.Tensor:
            w = torch.randn(*size, generator=g, device=device, dtype=torch.bfloat16)
            return w.mul_(size[-1] ** -0.5)

        def norm(*size) -> torch.Tensor:
            return 1 + 0.1 * torch.randn(*size, generator=g, device=device)

        s, slots = shape, (shape.layers, context + 1, shape.kv_heads, shape.head_dim)
        return Step(
            shape=s,
            context=context,
            w_qkv=weight(s.layers, s.qkv, s.hidden),
            w_o=weight(s.layers, s.hidden, s.heads * s.head_dim),
            w_gate_up=weight(s.layers, 2 * s.intermediate, s.hidden),
            w_down=weight(s.layers, s.hidden, s.intermediate),
            norm_attention=norm(s.layers, s.hidden),
            norm_mlp=norm(s.layers, s.hidden),
            norm_final=norm(s.hidden),
            w_out=weight(s.vocab, s.hidden),
            keys=torch.randn(slots, generator=g, device=device, dtype=torch.bfloat16),
            values=torch.randn(slots, generator=g, device=device, dtype=torch.bfloat16),
            x0=torch.randn(s.hidden, generator=g, device=device),
        )

    def bytes_read(self) -> int:
        """The weights' bytes and the cache positions attention reads: what a step must read."""
        weights = (self.w_qkv, self.w_o, self.w_gate_up, self.w_down, self.w_out)
        cache = 2 * self.shape.layers * self.context * self.shape.kv_heads * self.shape.head_dim
        return sum(w.numel() * w.element_size() for w in weights) + cache * 2


def reference(step: Step, eps: float = 1e-5) -> torch.Tensor:
    """The step in plain PyTorch, fp32 on bf16 weights: the logits every form must give."""
    s = step.shape

    def rms(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return v * torch.rsqrt(v.pow(2).mean() + eps) * weight

    x = step.x0.clone()
    group = s.heads // s.kv_heads
    for layer in range(s.layers):
        qkv = step.w_qkv[layer].float() @ rms(x, step.norm_attention[layer])
        q = qkv[: s.heads * s.head_dim].view(s.heads, s.head_dim)
        k = step.keys[layer, : step.context].float().repeat_interleave(group, dim=1)  # [T, H, D]
        v = step.values[layer, : step.context].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q, k) / s.head_dim**0.5
        attended = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), v).reshape(-1)
        h = x + step.w_o[layer].float() @ attended
        gate_up = step.w_gate_up[layer].float() @ rms(h, step.norm_mlp[layer])
        gate, up = gate_up[: s.intermediate], gate_up[s.intermediate :]
        x = h + step.w_down[layer].float() @ (torch.nn.functional.silu(gate) * up)
    return step.w_out.float() @ rms(x, step.norm_final)


@triton.jit
def _grid_barrier(counter_ptr, target):
    """Every program arrives (one atomic add, released at the GPU's scope), then waits until the
    counter reaches `target`. The wait polls with plain volatile loads (an atomic per poll would
    queue behind the arrivals on the counter's one address) and acquires once it is through."""
    tl.debug_barrier()  # the program's own writes are all issued before it arrives
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = tl.load(counter_ptr, volatile=True)
    polls = 0
    while (seen < target) & (polls < SPIN_LIMIT):
        seen = tl.load(counter_ptr, volatile=True)
        polls += 1
    if polls == SPIN_LIMIT:  # not every program resident: the result is void, and says so
        tl.atomic_add(counter_ptr + 2, 1, sem="relaxed", scope="gpu")
    tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _operand(x_ptr, norm_ptr, k, inverse_rms, K: tl.constexpr, NORM: tl.constexpr,
             GATED: tl.constexpr):  # fmt: skip
    """The product's input at features `k`: x normed (NORM), SiLU(x[:K]) * x[K:] (GATED), or x.
    Read through L2 only (.cg): another program wrote it since this one's L1 last saw it."""
    if GATED:
        gate = tl.load(x_ptr + k, cache_modifier=".cg")
        up = tl.load(x_ptr + K + k, cache_modifier=".cg")
        a = gate * tl.sigmoid(gate) * up
    else:
        a = tl.load(x_ptr + k, cache_modifier=".cg")
        if NORM:
            a = a * inverse_rms * tl.load(norm_ptr + k)
    return a


@triton.jit
def _product(x_ptr, norm_ptr, w_ptr, res_ptr, out_ptr, N, eps, first, stride,
             K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """out[n] = w[n, :] · a (+ res[n]) for tiles first, first + stride, ... of BLOCK_N outputs.
    Each tile's products add into an accumulator of the tile's shape, summed once (no reduction
    across threads inside the loop)."""
    k = tl.arange(0, BLOCK_K)
    inverse_rms = 1.0
    if NORM:  # the row's mean square, once per program and phase
        squares = tl.zeros((BLOCK_K,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xk = tl.load(x_ptr + k0 + k, cache_modifier=".cg")
            squares += xk * xk
        inverse_rms = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
    for tile in range(first, tl.cdiv(N, BLOCK_N), stride):
        n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < N
        row = w_ptr + n.to(tl.int64)[:, None] * K
        products = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            w = tl.load(row + (k0 + k)[None, :], mask=n_ok[:, None], other=0.0)
            a = _operand(x_ptr, norm_ptr, k0 + k, inverse_rms, K, NORM, GATED)
            products += w.to(tl.float32) * a[None, :]
        y = tl.sum(products, axis=1)
        if RESIDUAL:
            y += tl.load(res_ptr + n, mask=n_ok, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + n, y, mask=n_ok)


@triton.jit
def _attention(qkv_ptr, k_ptr, v_ptr, out_ptr, context, scale, first, stride,
               HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr,
               BLOCK_T: tl.constexpr):  # fmt: skip
    """Each query head (first, first + stride, ...) over the cache's first `context` positions,
    with an online softmax; grouped heads read their key/value head."""
    d = tl.arange(0, DIM)
    for head in range(first, HEADS, stride):
        kv = head // (HEADS // KV_HEADS)
        q = tl.load(qkv_ptr + head * DIM + d, cache_modifier=".cg") * scale
        m = tl.full((), float("-inf"), tl.float32)
        total = tl.zeros((), tl.float32)
        acc = tl.zeros((DIM,), tl.float32)
        for t0 in range(0, context, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            ok = t < context
            at = t[:, None] * (KV_HEADS * DIM) + kv * DIM + d[None, :]
            k = tl.load(k_ptr + at, mask=ok[:, None], other=0.0)
            v = tl.load(v_ptr + at, mask=ok[:, None], other=0.0)
            s = tl.where(ok, tl.sum(k.to(tl.float32) * q[None, :], axis=1), float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m - m_new)
            total = total * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
            m = m_new
        tl.store(out_ptr + head * DIM + d, acc / total)


@triton.jit
def _phase(layer, phase, first, stride,
           x_ptr, h_ptr, qkv_ptr, att_ptr, gu_ptr, logits_ptr,
           w_qkv, w_o, w_gu, w_down, n_attention, n_mlp, n_final, w_out, keys, values,
           context, eps, scale,
           HIDDEN: tl.constexpr, QKV_N: tl.constexpr, INTER: tl.constexpr, VOCAB: tl.constexpr,
           HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr, SLOTS: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
    """One phase of one layer (module doc): this program's share of it."""
    at = (layer + first * 0).to(tl.int64)  # a tensor also where the loop's index is an int
    if phase == 0:
        _product(x_ptr, n_attention + at * HIDDEN, w_qkv + at * QKV_N * HIDDEN, x_ptr, qkv_ptr,
                 QKV_N, eps, first, stride, HIDDEN, True, False, False, BLOCK_N, BLOCK_K)  # fmt: skip
    elif phase == 1:
        cache = at * SLOTS * KV_HEADS * DIM
        _attention(qkv_ptr, keys + cache, values + cache, att_ptr, context, scale, first, stride,
                   HEADS, KV_HEADS, DIM, BLOCK_T)  # fmt: skip
    elif phase == 2:
        _product(att_ptr, n_mlp, w_o + at * HIDDEN * HEADS * DIM, x_ptr, h_ptr, HIDDEN, eps,
                 first, stride, HEADS * DIM, False, False, True, BLOCK_N, BLOCK_K)  # fmt: skip
    elif phase == 3:
        _product(h_ptr, n_mlp + at * HIDDEN, w_gu + at * 2 * INTER * HIDDEN, h_ptr, gu_ptr,
                 2 * INTER, eps, first, stride, HIDDEN, True, False, False, BLOCK_N, BLOCK_K)  # fmt: skip
    elif phase == 4:
        _product(gu_ptr, n_mlp, w_down + at * HIDDEN * INTER, h_ptr, x_ptr, HIDDEN, eps, first,
                 stride, INTER, False, True, True, BLOCK_N, BLOCK_K)  # fmt: skip
    else:
        _product(x_ptr, n_final, w_out, x_ptr, logits_ptr, VOCAB, eps, first, stride, HIDDEN,
                 True, False, False, BLOCK_N, BLOCK_K)  # fmt: skip


@triton.jit
def persistent_step(counter_ptr,
                    x_ptr, h_ptr, qkv_ptr, att_ptr, gu_ptr, logits_ptr,
                    w_qkv, w_o, w_gu, w_down, n_attention, n_mlp, n_final, w_out, keys, values,
                    context, eps, scale,
                    LAYERS: tl.constexpr, HIDDEN: tl.constexpr, QKV_N: tl.constexpr,
                    INTER: tl.constexpr, VOCAB: tl.constexpr, HEADS: tl.constexpr,
                    KV_HEADS: tl.constexpr, DIM: tl.constexpr, SLOTS: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                    EMPTY: tl.constexpr):  # fmt: skip
    """The whole step in one launch: every phase of every layer, a grid-wide barrier after each.
    EMPTY: the barriers alone (what they cost)."""
    first = tl.program_id(0)
    programs = tl.num_programs(0)
    met = 0
    for layer in range(LAYERS):
        for phase in range(5):
            if not EMPTY:
                _phase(layer, phase, first, programs,
                       x_ptr, h_ptr, qkv_ptr, att_ptr, gu_ptr, logits_ptr,
                       w_qkv, w_o, w_gu, w_down, n_attention, n_mlp, n_final, w_out, keys, values,
                       context, eps, scale, HIDDEN, QKV_N, INTER, VOCAB, HEADS, KV_HEADS, DIM,
                       SLOTS, BLOCK_N, BLOCK_K, BLOCK_T)  # fmt: skip
            met += 1
            _grid_barrier(counter_ptr, met * programs)
    if not EMPTY:
        _phase(0, 5, first, programs,
               x_ptr, h_ptr, qkv_ptr, att_ptr, gu_ptr, logits_ptr,
               w_qkv, w_o, w_gu, w_down, n_attention, n_mlp, n_final, w_out, keys, values,
               context, eps, scale, HIDDEN, QKV_N, INTER, VOCAB, HEADS, KV_HEADS, DIM,
               SLOTS, BLOCK_N, BLOCK_K, BLOCK_T)  # fmt: skip
    # the last program out resets both counters: every program is past every barrier by then
    out = tl.atomic_add(counter_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if out == programs - 1:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(counter_ptr + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def phase_kernel(x_ptr, h_ptr, qkv_ptr, att_ptr, gu_ptr, logits_ptr,
                 w_qkv, w_o, w_gu, w_down, n_attention, n_mlp, n_final, w_out, keys, values,
                 context, eps, scale, layer,
                 PHASE: tl.constexpr, HIDDEN: tl.constexpr, QKV_N: tl.constexpr,
                 INTER: tl.constexpr, VOCAB: tl.constexpr, HEADS: tl.constexpr,
                 KV_HEADS: tl.constexpr, DIM: tl.constexpr, SLOTS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                 PDL: tl.constexpr):  # fmt: skip
    """One phase of one layer as a kernel of its own; with PDL it waits for its predecessor
    before anything it reads."""
    first = tl.program_id(0) + after_predecessor(PDL)
    _phase(layer, PHASE, first, tl.num_programs(0),
           x_ptr, h_ptr, qkv_ptr, att_ptr, gu_ptr, logits_ptr,
           w_qkv, w_o, w_gu, w_down, n_attention, n_mlp, n_final, w_out, keys, values,
           context, eps, scale, HIDDEN, QKV_N, INTER, VOCAB, HEADS, KV_HEADS, DIM,
           SLOTS, BLOCK_N, BLOCK_K, BLOCK_T)  # fmt: skip


class Forms:
    """The step's buffers, and a launcher of each form over them."""

    def __init__(self, step: Step, block_n: int, block_k: int, block_t: int, warps: int):
        s, device = step.shape, step.x0.device
        if s.hidden % block_k or s.intermediate % block_k:
            raise ValueError(f"BLOCK_K {block_k} must divide {s.hidden} and {s.intermediate}")
        self.step, self.warps = step, warps
        self.x = torch.empty(s.hidden, device=device)
        self.h = torch.empty(s.hidden, device=device)
        self.qkv = torch.empty(s.qkv, device=device)
        self.att = torch.empty(s.heads * s.head_dim, device=device)
        self.gu = torch.empty(2 * s.intermediate, device=device)
        self.logits = torch.empty(s.vocab, device=device)
        self.counter = torch.zeros(3, dtype=torch.int32, device=device)  # arrivals, exits, gave up
        self.args = (
            self.x, self.h, self.qkv, self.att, self.gu, self.logits,
            step.w_qkv, step.w_o, step.w_gate_up, step.w_down, step.norm_attention,
            step.norm_mlp, step.norm_final, step.w_out, step.keys, step.values,
            step.context, 1e-5, s.head_dim**-0.5,
        )  # fmt: skip
        self.sizes = dict(
            HIDDEN=s.hidden, QKV_N=s.qkv, INTER=s.intermediate, VOCAB=s.vocab, HEADS=s.heads,
            KV_HEADS=s.kv_heads, DIM=s.head_dim, SLOTS=step.keys.shape[1], BLOCK_N=block_n,
            BLOCK_K=block_k, BLOCK_T=block_t,
        )  # fmt: skip

    def persistent(self, programs: int, empty: bool = False) -> None:
        self.x.copy_(self.step.x0)
        persistent_step[(programs,)](
            self.counter, *self.args, LAYERS=self.step.shape.layers, EMPTY=empty,
            num_warps=self.warps, num_stages=1, **self.sizes,
        )  # fmt: skip

    def resident_per_sm(self) -> int:
        """How many programs of the persistent kernel an SM holds at once (registers, threads,
        shared memory): more a launch cannot have, or its barriers would wait forever."""
        compiled = persistent_step.warmup(
            self.counter, *self.args, grid=(1,), LAYERS=self.step.shape.layers, EMPTY=False,
            num_warps=self.warps, num_stages=1, **self.sizes,
        )  # fmt: skip
        compiled._init_handles()  # n_regs is read when the kernel is loaded
        props = torch.cuda.get_device_properties(0)
        per_warp = -(-max(compiled.n_regs, 1) * 32 // 256) * 256  # allocated 256 at a time
        by_registers = getattr(props, "regs_per_multiprocessor", 65536) // (per_warp * self.warps)
        by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * self.warps)
        shared = compiled.metadata.shared
        room = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
        by_shared = room // shared if shared else 32
        return min(by_registers, by_threads, by_shared, 32)

    def per_phase(self, programs: int, pdl: bool = False) -> None:
        self.x.copy_(self.step.x0)
        extra = {"launch_pdl": True} if pdl else {}
        for layer in range(self.step.shape.layers):
            for phase in range(5):
                phase_kernel[(programs,)](
                    *self.args, layer, PHASE=phase, PDL=pdl, num_warps=self.warps,
                    num_stages=1, **self.sizes, **extra,
                )  # fmt: skip
        phase_kernel[(programs,)](
            *self.args, 0, PHASE=FINAL, PDL=pdl, num_warps=self.warps, num_stages=1,
            **self.sizes, **extra,
        )  # fmt: skip


def aotc_step(step: Step, tuned: bool = False):
    """The same step through aotc's own kernels, as a fused bf16 package's step launches them:
    each product with its norm, activation or residual (fused_gemv, with PDL), and the split
    attention with its combine. `tuned`: each product's tile chosen by timing, as a build does
    (product_tiles.py), else the launch rule's. Returns a callable that gives the logits (its
    inputs made once, outside what is timed)."""
    from aotc.kernels.attention import attend
    from aotc.kernels.fused_gemv import fused_gemv
    from aotc.kernels.product_tiles import tiles_in_force
    from aotc.kernels.split_attention import split_count

    s, eps = step.shape, 1e-5
    device = step.x0.device
    rows = torch.zeros(1, dtype=torch.long, device=device)
    positions = torch.full((1,), step.context - 1, dtype=torch.long, device=device)
    splits = split_count(1, s.heads)
    q_size = s.heads * s.head_dim
    norms = [
        (a.to(torch.bfloat16), m.to(torch.bfloat16))
        for a, m in zip(step.norm_attention, step.norm_mlp)
    ]
    norm_final = step.norm_final.to(torch.bfloat16)
    table = build_tiles(step) if tuned else {}

    def run() -> torch.Tensor:
        with tiles_in_force(table):
            return products()

    def products() -> torch.Tensor:
        x = step.x0[None]
        for layer, (norm_a, norm_m) in enumerate(norms):
            qkv = fused_gemv(x, step.w_qkv[layer], None, norm_a, None, eps, False, 0.0, pdl=True)
            query = qkv[:, :q_size].view(1, 1, s.heads, s.head_dim).transpose(1, 2)
            # the cache up to the step's context (its last slot the padding's), as a package's is
            keys = step.keys[layer, : step.context + 1][None]
            values = step.values[layer, : step.context + 1][None]
            attended = attend(
                query, keys, values, rows, positions, s.head_dim**-0.5, 0, 0.0, splits
            )
            h = fused_gemv(
                attended.view(1, q_size), step.w_o[layer], None, None, x, eps, False, 0.0, pdl=True
            )
            gate_up = fused_gemv(
                h, step.w_gate_up[layer], None, norm_m, None, eps, False, 0.0, pdl=True
            )
            x = fused_gemv(gate_up, step.w_down[layer], None, None, h, eps, True, 0.0, pdl=True)
        return fused_gemv(x, step.w_out, None, norm_final, None, eps, False, 0.0, pdl=True)[0]

    return run


def build_tiles(step: Step) -> dict:
    """The tile a build would choose for each of the step's products, timed on this GPU."""
    from aotc.kernels.product_tiles import choose, key_of, surroundings
    from aotc.kernels.tile_timing import rule_for, seconds_on_gpu

    s, device = step.shape, step.x0.device
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    shapes = [
        (s.qkv, s.hidden, (True, False, False)),
        (s.hidden, s.heads * s.head_dim, (False, False, True)),
        (2 * s.intermediate, s.hidden, (True, False, False)),
        (s.hidden, s.intermediate, (False, True, True)),
        (s.vocab, s.hidden, (True, False, False)),
    ]
    keys = [key_of(n, k, torch.bfloat16, surroundings(*around)) for n, k, around in shapes]
    table, _record = choose(
        keys, lambda key: rule_for(key, sms), lambda key, tile: seconds_on_gpu(key, tile, device)
    )
    return table


def check(step: Step, forms: Forms, programs: int, persistent_programs: int) -> dict:
    """Each form's logits against the reference: the largest difference over the largest logit."""
    expected = reference(step)
    scale = expected.abs().max().item()
    errors = {}
    forms.persistent(persistent_programs)
    errors["persistent"] = (forms.logits - expected).abs().max().item() / scale
    if forms.counter[2].item():
        errors["persistent"] = float("inf")  # a barrier gave up: not every program was resident
        forms.counter.zero_()
    forms.per_phase(programs)
    errors["per_phase"] = (forms.logits - expected).abs().max().item() / scale
    if step.x0.is_cuda:
        errors["aotc"] = (aotc_step(step)().float() - expected).abs().max().item() / scale
    return errors


def timed(call, replays: int) -> dict:
    from aotc.kernels.graph_timing import replay_seconds

    us = sorted(t * 1e6 for t in replay_seconds(call, replays))
    return {
        "median_us": round(statistics.median(us), 2),
        "p10_us": round(us[len(us) // 10], 2),
        "p90_us": round(us[len(us) * 9 // 10], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    parser.add_argument("--tiny", action="store_true", help="the tiny shape (the CPU check)")
    parser.add_argument("--context", type=int, default=176, help="cached positions attended to")
    parser.add_argument("--tiles", default="8x1024x4,16x512x4,4x2048x4,16x1024x8",
                        help="BLOCK_NxBLOCK_Kxwarps forms to time")  # fmt: skip
    parser.add_argument("--programs-per-sm", default="1,2,4")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shape = SHAPES["tiny" if args.tiny else args.shape]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    step = Step.random(shape, args.context if not args.tiny else 19, device)
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
    if args.tiny:
        tiles = [(4, 32, 1)]
    block_t = 64
    if args.check_only:
        forms = Forms(step, *tiles[0][:2], block_t, tiles[0][2])
        # Triton's interpreter runs programs one after another: a barrier only one program passes
        sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 1
        errors = check(step, forms, programs=3, persistent_programs=sms)
        print(json.dumps(errors))
        # the prototype's forms compute in fp32 as the reference does; aotc's kernels round each
        # product's output to bf16 as a package does (about 1% of the largest logit at 16 layers)
        exact = max(errors["persistent"], errors["per_phase"]) < 1e-3
        return 0 if exact and errors.get("aotc", 0.0) < 5e-2 else 1

    from aotc.bench.generation import copy_bandwidth

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bandwidth = copy_bandwidth()
    floor_us = step.bytes_read() / bandwidth * 1e6
    results = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shape": asdict(shape),
        "context": step.context,
        "copy_bandwidth_tb_s": round(bandwidth / 1e12, 3),
        "bytes_read": step.bytes_read(),
        "floor_us": round(floor_us, 1),
        "forms": [],
    }

    def record(form: str, timing: dict, **where) -> None:
        timing["of_floor"] = round(floor_us / timing["median_us"], 3)
        results["forms"].append({"form": form, **where, **timing})
        print(json.dumps(results["forms"][-1]), flush=True)
        if args.out:  # as they come: a run cut short keeps what it measured
            args.out.write_text(json.dumps(results, indent=1) + "\n")

    record("aotc", timed(aotc_step(step), args.replays), tiles="the launch rule's")
    record("aotc", timed(aotc_step(step, tuned=True), args.replays), tiles="timed, as a build")
    for block_n, block_k, warps in tiles:
        forms = Forms(step, block_n, block_k, block_t, warps)
        tile = f"{block_n}x{block_k}x{warps}"
        fits = forms.resident_per_sm()
        for per_sm in (int(p) for p in args.programs_per_sm.split(",")):
            if per_sm > fits:
                print(f"{tile}: {per_sm} programs an SM do not fit (at most {fits})", flush=True)
                continue
            programs = per_sm * sms
            errors = check(step, forms, programs, programs)
            where = {"tile": tile, "programs": programs, "fit_per_sm": fits, "error": errors}
            if errors["persistent"] == float("inf"):
                print(f"{tile} x {programs}: a barrier gave up; not timed", flush=True)
                continue
            record("persistent", timed(partial(forms.persistent, programs), args.replays), **where)
            record("barriers_only", timed(partial(forms.persistent, programs, True), args.replays),
                   **where)  # fmt: skip
            for pdl in (False, True):
                record(f"per_phase{'_pdl' if pdl else ''}",
                       timed(partial(forms.per_phase, programs, pdl), args.replays), **where)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
