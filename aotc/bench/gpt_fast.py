"""The gpt-fast-style contender of a text-generation bench: the simplest PyTorch-native fast decode.

After pytorch-labs/gpt-fast's `model.py` and `generate.py` (ideas, not code): a hand-written
decoder of the Llama family (Llama, Mistral, Qwen2, Qwen3) on the transformers model's own weights,
with the static KV cache in module buffers, q/k/v and gate/up each one GEMM, and the whole decode
step, the greedy pick included, under torch.compile(mode="reduce-overhead", fullgraph=True) on
CUDA (mode "default" on the CPU). The prefill runs eagerly: gpt-fast compiles it apart, and the
bench's decode rate does not count it. A model of another architecture is refused in one line.

With `int4_group`, every linear weight (the output layer's too, as gpt-fast's int4 handler and
aotc's int4 packages do) is stored as gpt-fast stores it for its int4 mode: torch's tinygemm
layout (`_weight_int4pack_mm`, bf16 activations; its CPU twin on the CPU), from the same
asymmetric groups aotc's int4-weight-only packs (aotc/export/quantized_linear.py's int4_groups),
so a package and this contender multiply the same quantized values.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

FAMILIES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class Int4Weight(nn.Module):
    """A linear weight [N, K] as tinygemm's int4 tiles and its groups' scales and zeros; called
    as the product x @ weight.T in x's dtype."""

    def __init__(self, weight: torch.Tensor, group: int):
        super().__init__()
        from aotc.export import quantized_linear as ql

        k = weight.shape[1]
        if k % group:
            raise ValueError(f"int4 groups of {group} do not divide a layer of {k} input features")
        self.group = group
        w = weight.detach()
        # the layouts and products aotc's int4 packages use on each device
        if w.is_cuda:
            packed, scale_zero = ql.int4_tinygemm(w, group)
            self.product = ql.int4_tinygemm_mm
        else:
            packed, scale_zero = ql.int4_cpu_tiles(*ql.int4_groups(w, group, torch.bfloat16))
            self.product = ql.int4_cpu_mm
        self.register_buffer("packed", packed)
        self.register_buffer("scale_zero", scale_zero)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = self.product(flat, self.packed, self.scale_zero, self.group)
        return out.reshape(*x.shape[:-1], -1)


def linear(x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), for a float weight or an Int4Weight."""
    if isinstance(weight, Int4Weight):
        out = weight(x)
        return out if bias is None else out + bias
    return F.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: normalised in float32, scaled in the model's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in transformers' half-split layout (rotate_half)."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class Layer(nn.Module):
    def __init__(self, source: Any, cfg: dict, batch: int, max_len: int):
        super().__init__()
        attention, mlp = source.self_attn, source.mlp
        self.cfg = cfg
        stack = lambda *linears: nn.Parameter(torch.cat([m.weight for m in linears]).detach())  # noqa: E731
        self.wqkv = stack(attention.q_proj, attention.k_proj, attention.v_proj)
        biases = [m.bias for m in (attention.q_proj, attention.k_proj, attention.v_proj)]
        self.bqkv = (
            nn.Parameter(torch.cat(biases).detach()) if biases[0] is not None else None
        )  # Qwen2's q/k/v biases
        self.wo = nn.Parameter(attention.o_proj.weight.detach())
        self.w13 = stack(mlp.gate_proj, mlp.up_proj)
        self.w2 = nn.Parameter(mlp.down_proj.weight.detach())
        self.norm1 = nn.Parameter(source.input_layernorm.weight.detach())
        self.norm2 = nn.Parameter(source.post_attention_layernorm.weight.detach())
        q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
        self.q_norm = nn.Parameter(q_norm.weight.detach()) if q_norm is not None else None
        self.k_norm = nn.Parameter(k_norm.weight.detach()) if k_norm is not None else None
        shape = (batch, cfg["kv_heads"], max_len, cfg["head_dim"])
        dtype, device = self.wqkv.dtype, self.wqkv.device
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device))

    def forward(self, x, pos, cos, sin, mask):
        c = self.cfg
        batch, length, _ = x.shape
        heads, kv, dim, eps = c["heads"], c["kv_heads"], c["head_dim"], c["eps"]
        qkv = linear(rms_norm(x, self.norm1, eps), self.wqkv, self.bqkv)
        q, k, v = qkv.split([heads * dim, kv * dim, kv * dim], dim=-1)
        q = q.view(batch, length, heads, dim)
        k = k.view(batch, length, kv, dim)
        if self.q_norm is not None:  # Qwen3: each head's q and k normed before the rotation
            q, k = rms_norm(q, self.q_norm, eps), rms_norm(k, self.k_norm, eps)
        q = rotate(q.transpose(1, 2), cos, sin)
        k = rotate(k.transpose(1, 2), cos, sin)
        v = v.view(batch, length, kv, dim).transpose(1, 2)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        out = F.scaled_dot_product_attention(
            q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=heads != kv
        )
        x = x + linear(out.transpose(1, 2).reshape(batch, length, heads * dim), self.wo)
        gate, up = linear(rms_norm(x, self.norm2, eps), self.w13).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, self.w2)

    def to_int4(self, group: int) -> None:
        """Its four products' weights as Int4Weight (gpt-fast's int4 mode)."""
        for name in ("wqkv", "wo", "w13", "w2"):
            weight = getattr(self, name)
            delattr(self, name)
            setattr(self, name, Int4Weight(weight, group))


class FastLM(nn.Module):
    """`model`'s weights (not copied: the parameters share them, stacked ones excepted) as one
    forward over `batch` rows and a `max_len` static cache: (ids [B, S], positions [S]) -> the
    greedy next token of each row [B]. `int4_group`: the linear weights in int4 (the module's
    doc)."""

    def __init__(self, model: Any, batch: int, max_len: int, int4_group: int | None = None):
        super().__init__()
        name = type(model).__name__
        if name not in FAMILIES:
            raise ValueError(
                f"the gpt-fast-style decoder is written for {', '.join(FAMILIES)}, not {name}"
            )
        config = model.config
        window = getattr(config, "sliding_window", None)
        if window and window < max_len and getattr(config, "use_sliding_window", True) is not False:
            raise ValueError(
                f"the gpt-fast-style decoder has no sliding window ({name}'s is {window})"
            )
        heads = config.num_attention_heads
        cfg = {
            "heads": heads,
            "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
            "eps": config.rms_norm_eps,
        }
        inner = model.model
        self.embed = nn.Parameter(inner.embed_tokens.weight.detach())
        self.layers = nn.ModuleList(Layer(layer, cfg, batch, max_len) for layer in inner.layers)
        self.norm = nn.Parameter(inner.norm.weight.detach())
        head = nn.Parameter(model.lm_head.weight.detach())
        self.head: Any = Int4Weight(head, int4_group) if int4_group else head
        for layer in self.layers if int4_group else ():
            layer.to_int4(int4_group)
        self.eps = cfg["eps"]
        # the model's own rotary frequencies and scaling (Llama 3's rope_scaling included)
        rotary = inner.rotary_emb
        positions = torch.arange(max_len, device=self.embed.device, dtype=torch.float32)
        freqs = positions[:, None] * rotary.inv_freq.to(positions.device).float()[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rotary, "attention_scaling", 1.0)
        self.register_buffer("cos", (angles.cos() * scale).to(self.embed.dtype))
        self.register_buffer("sin", (angles.sin() * scale).to(self.embed.dtype))
        self.register_buffer(
            "causal",
            torch.ones(max_len, max_len, dtype=torch.bool, device=self.embed.device).tril(),
        )

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.logits(ids, pos).argmax(dim=-1)

    def logits(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The last position's logits of each row [B, vocab] (the cache updated as forward's)."""
        x = F.embedding(ids, self.embed)
        cos, sin, mask = self.cos[pos], self.sin[pos], self.causal[pos]
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        last = rms_norm(x[:, -1], self.norm, self.eps)
        return linear(last, self.head)


class GptFastDecoder:
    """Greedy generation with FastLM: `generate(ids, n, on_token)` calls `on_token` as each new
    token [B] reaches the host and returns the prompt followed by the new tokens."""

    def __init__(self, model: Any, max_len: int, compiled: bool, int4_group: int | None = None):
        device = model.lm_head.weight.device
        self.lm = FastLM(model, batch=1, max_len=max_len, int4_group=int4_group).eval()
        self.max_len = max_len
        self.cuda = device.type == "cuda"
        self.decode = self.lm
        if compiled:
            mode = "reduce-overhead" if self.cuda else "default"
            self.decode = torch.compile(self.lm, mode=mode, fullgraph=True)

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, n: int, on_token: Any = None) -> torch.Tensor:
        device = self.lm.embed.device
        ids = ids.to(device)
        length = ids.shape[1]
        if length + n > self.max_len:
            raise ValueError(f"{length} + {n} tokens do not fit the {self.max_len}-position cache")
        for layer in self.lm.layers:  # positions past the prompt are masked, but NaN-free
            layer.k_cache.zero_()
            layer.v_cache.zero_()
        token = self.lm(ids, torch.arange(length, device=device))
        new = [token.cpu()]
        if on_token:
            on_token()
        pos = torch.tensor([length], device=device)
        for _ in range(n - 1):
            if self.cuda:
                torch.compiler.cudagraph_mark_step_begin()
            token = self.decode(token[:, None], pos).clone()
            new.append(token.cpu())  # the host waits for the step, as every contender's does
            if on_token:
                on_token()
            pos += 1
        return torch.cat([ids.cpu(), torch.stack(new, 1)], dim=1)
