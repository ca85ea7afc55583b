"""A transformers decoder LM as one step of generation over aotc's own KV cache, in which every
row (sequence) has its own timeline:

    step(input_ids [B, S], cache_lengths [B], input_lengths [B]) -> logits [B, vocab]

- Row b holds `cache_lengths[b]` tokens before the step and is fed the last `input_lengths[b]`
  tokens of its window `input_ids[b]` (the window is left-padded; 0 feeds the row nothing). They go
  to positions cache_lengths[b].., and the logits are those of the window's last token.
- Prefill, a chunk of a long prompt, and decode (S = 1) are the same program with S dynamic, and
  rows of one step may do different ones: a sequence joins a running batch in the step that
  decodes the others (aotc_runtime/decode_engine.py).
- The cache is one pair of buffers per layer, [B, max_len + 1, kv heads, head dim], mutated in
  place (the package's state). Slot max_len takes the padding's keys and values and is never read.

transformers' hooks put aotc in charge of both halves of attention: `RowCache` is the `Cache`
the model's layers call `update` on (the write), and "aotc" is the attention implementation they
call after it (the read), registered in transformers' `AttentionInterface`; it is the
`aotc::cached_attention` operator (cached_attention.py), which each build lowers for its device.
A model whose attention does not go through that interface (Falcon) gets a 4-D mask with the same
meaning and reads the whole cache with its own attention.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from aotc.errors import UserInputError
from aotc.export.cached_attention import _allowed, cached_attention

IMPLEMENTATION = "aotc"
STEP_INPUTS = ("input_ids", "cache_lengths", "input_lengths")

# The step being traced or run: the attention function reads the rows' timelines from it (the
# model's layers pass the attention only what transformers gives every implementation).
_active: list[RowCache] = []


class RowCache:
    """The model's `past_key_values`: writes each layer's new keys and values at each row's own
    positions and hands the whole buffers to the attention (transformers' `Cache` protocol: the
    layers call `update`; the rest is what generic code asks of a cache)."""

    is_compileable = True

    def __init__(self, keys: list, values: list):
        self.keys, self.values = keys, values
        self.starts: torch.Tensor | None = None  # [B]: the position of each row's window token 0
        self.firsts: torch.Tensor | None = None  # [B]: each row's first window token it is fed
        self.slots: torch.Tensor | None = None  # [B, S]: where each window token is written
        self.positions: torch.Tensor | None = None  # [B, S]: each token's position, in the cache

    def begin(self, cache_lengths: torch.Tensor, input_lengths: torch.Tensor, steps: int) -> None:
        length = self.keys[0].shape[1] - 1  # slot `length` is the padding's
        window = torch.arange(steps, device=cache_lengths.device)
        self.firsts = steps - input_lengths
        self.starts = cache_lengths - self.firsts
        unclamped = self.starts[:, None] + window[None, :]
        fed = window[None, :] >= self.firsts[:, None]
        # a token past the cache (a step queued after a row's last) goes to the padding's slot too
        self.slots = torch.where(fed, unclamped, length).clamp(min=0, max=length)
        self.positions = unclamped.clamp(min=0, max=length - 1)

    def update(self, key_states, value_states, layer_idx: int, cache_kwargs: Any = None):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        batch = keys.shape[0]
        rows = torch.arange(batch, device=keys.device)[:, None].expand_as(self.slots)
        # [B, Hkv, S, D] -> [B, S, Hkv, D], the cache's layout
        keys.index_put_((rows, self.slots), key_states.transpose(1, 2).to(keys.dtype))
        values.index_put_((rows, self.slots), value_states.transpose(1, 2).to(values.dtype))
        return keys.transpose(1, 2), values.transpose(1, 2)  # [B, Hkv, L + 1, D] views

    # what generic transformers code may ask of a cache; the step passes positions and a mask, so
    # none of it decides anything here
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def is_sliding(self) -> list:
        return [False] * len(self.keys)


def aotc_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple:
    """transformers' attention-function signature: query [B, Hq, S, D], key/value what
    `RowCache.update` returned; (output [B, S, Hq, D], no weights)."""
    unsupported = [name for name in ("s_aux", "sinks") if kwargs.get(name) is not None]
    if unsupported:
        raise UserInputError(
            f"{type(module).__name__} uses attention sinks ({unsupported[0]}), which aotc's "
            "generation attention does not implement; export it as one call instead: `aotc export "
            "MODEL --input-shape input_ids=1x16 --dtype int64`"
        )
    cache = _active[-1]
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = cached_attention(
        query,
        key.transpose(1, 2),
        value.transpose(1, 2),
        cache.starts,
        scale,
        int(sliding_window or 0),
        float(softcap or 0.0),
        cache.firsts,
    )
    return out, None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, aotc_attention)


@contextlib.contextmanager
def owned_attention(model: Any, cache: RowCache):
    """The model's layers call aotc's attention (and see `cache` as the active one) inside."""
    _register()
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
    before = [c._attn_implementation for c in configs]
    _active.append(cache)
    try:
        for config in configs:
            config._attn_implementation = IMPLEMENTATION
        yield
    finally:
        _active.pop()
        for config, name in zip(configs, before):
            config._attn_implementation = name


def additive_mask(cache: RowCache, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, S, L + 1] the same reads as a mask (0 where read, the dtype's lowest elsewhere), for
    models whose attention takes the mask instead of the attention function."""
    assert cache.starts is not None
    length = cache.keys[0].shape[1] - 1
    allowed = _allowed(cache.starts, steps, length, 0)
    allowed = torch.nn.functional.pad(allowed, (0, 1))  # the padding's slot: never read
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    lowest = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, lowest)[:, None]


def row_step(model: Any, batch_size: int, max_len: int, heads: int, head_dim: int):
    """`model` (a transformers *ForCausalLM, eval mode) as one step over aotc's cache, see above."""
    import inspect

    layers = model.config.get_text_config().num_hidden_layers
    device = next(model.parameters()).device
    accepts = inspect.signature(model.forward).parameters
    # the LM head on the window's last token only, as transformers' generate asks for it
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}

    class RowStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.layers = layers
            shape = (batch_size, max_len + 1, heads, head_dim)
            for i in range(layers):
                for kind in ("key_cache", "value_cache"):
                    zeros = torch.zeros(shape, dtype=model.dtype, device=device)
                    self.register_buffer(f"{kind}_{i}", zeros, persistent=False)

        def cache(self, kind: str) -> list:
            """The layers' `kind` buffers as this call sees them (a trace's own, not the ones
            made above)."""
            return [getattr(self, f"{kind}_{i}") for i in range(self.layers)]

        def zero_cache(self) -> None:
            # not self.buffers(): the model's own (RoPE's tables) are there too
            for buffer in self.cache("key_cache") + self.cache("value_cache"):
                buffer.zero_()

        def forward(self, input_ids, cache_lengths, input_lengths):
            cache = RowCache(self.cache("key_cache"), self.cache("value_cache"))
            steps = input_ids.shape[1]
            cache.begin(cache_lengths, input_lengths, steps)
            with owned_attention(self.model, cache):
                out = self.model(
                    input_ids=input_ids,
                    position_ids=cache.positions,
                    attention_mask=additive_mask(cache, steps, self.model.dtype),
                    past_key_values=cache,
                    use_cache=True,
                    **last_only,
                )
            return out.logits[:, -1, :]

    return RowStep().eval()
