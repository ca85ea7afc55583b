"""A transformers decoder LM as one step of generation over aotc's own KV cache, in which every
row (sequence) has its own timeline:

    step(input_ids [R, S], cache_lengths [R], input_lengths [R]) -> logits [R, vocab]

- Row b holds `cache_lengths[b]` tokens before the step and is fed the last `input_lengths[b]`
  tokens of its window `input_ids[b]` (the window is left-padded; 0 feeds the row nothing). They go
  to positions cache_lengths[b].., and the logits are those of the window's last token.
- Prefill, a chunk of a long prompt, and decode (S = 1) are the same program with S dynamic, and
  rows of one step may do different ones: a sequence joins a running batch in the step that
  decodes the others (aotc_runtime/decode_engine.py).
- The cache is one pair of buffers per layer, [B, max_len + 1, kv heads, head dim], mutated in
  place (the package's state). Slot max_len takes the padding's keys and values and is never read.
- A step may be fed fewer rows than the cache holds, R <= B (a dynamic dim): it runs for the
  cache's first R rows only, so rows no sequence holds cost nothing when they are the last ones.

transformers' hooks put aotc in charge of both halves of attention: `row_cache` is the `Cache`
the model's layers call `update` on (the write), and "aotc" is the attention implementation they
call after it (the read), registered in transformers' `AttentionInterface`; it is the
`aotc::cached_attention` operator (cached_attention.py), which each build lowers for its device.
A model whose attention does not go through that interface (Falcon) gets a 4-D mask with the same
meaning and reads the whole cache with its own attention.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from aotc.errors import UserInputError
from aotc.export.cached_attention import _allowed, cached_attention
from aotc.export.transformers_release import cache_keyword

IMPLEMENTATION = "aotc"
STEP_INPUTS = ("input_ids", "cache_lengths", "input_lengths")

# The step being traced or run: the attention function reads the rows' timelines from it (the
# model's layers pass the attention only what transformers gives every implementation).
_active: list[RowTimeline] = []


def row_cache(keys: list, values: list) -> Any:
    """The model's cache for one step: a transformers `Cache` whose layers are row layers over the
    step's buffers, sharing one `RowTimeline` (`cache.timeline`, set by its `begin`).

    A `Cache` built from `layers` (`CacheLayerMixin`s) is transformers' public way to bring a cache
    of one's own. Its `update(key_states, value_states, layer_idx, *args, **kwargs)` is
    transformers' own and hands the layer whatever the model's attention passes, and generic code
    (`len`, `is_sliding`, `get_seq_length`, isinstance checks) sees a real Cache. Checked against
    transformers 5.17.0 (layers called as `update(k, v, cache_kwargs)`) and 5.24.0
    (`update(k, v, kwargs=kwargs)`)."""
    from transformers.cache_utils import Cache

    timeline = RowTimeline(keys[0].shape[1] - 1)
    layer = _row_layer_class()
    cache = Cache(layers=[layer(timeline, k, v) for k, v in zip(keys, values)])
    cache.timeline = timeline
    return cache


@functools.cache
def _row_layer_class() -> type:
    """The row layer: a `CacheLayerMixin` (made on first use, so that importing this module does
    not import transformers)."""
    from transformers.cache_utils import CacheLayerMixin

    class RowLayer(CacheLayerMixin):
        """One layer's keys and values, [B, max_len + 1, kv heads, head dim], written at each
        row's own positions; the attention is handed the whole buffers."""

        is_compileable = True
        is_sliding = False  # a sliding window is the attention's to apply (cached_attention.py)

        def __init__(self, timeline: RowTimeline, keys: torch.Tensor, values: torch.Tensor):
            super().__init__()
            self.timeline = timeline
            self.keys, self.values, self.is_initialized = keys, values, True

        def lazy_initialization(self, *args: Any, **kwargs: Any) -> None:
            pass  # the step's buffers exist before the first write

        def update(self, key_states, value_states, *args: Any, **kwargs: Any) -> tuple:
            # what else a release passes (cache_kwargs, kwargs=...) decides nothing here: the
            # positions come from the timeline
            return self.timeline.write(self.keys, self.values, key_states, value_states)

        # the step passes positions and a 4-D mask (which transformers' masking takes as it is),
        # so these decide nothing; they answer truthfully for code that asks
        def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
            return self.timeline.length + 1, 0

        def get_seq_length(self, *args: Any, **kwargs: Any) -> int:
            return 0

        def get_max_length(self) -> int:
            return self.timeline.length

        def get_max_cache_shape(self) -> int:
            return self.timeline.length

    return RowLayer


class RowTimeline:
    """Where each row's window goes in the cache this step: set once by `begin`, read by every
    layer's write and by the attention."""

    def __init__(self, length: int):
        self.length = length  # slot `length` is the padding's
        self.starts: torch.Tensor | None = None  # [B]: the position of each row's window token 0
        self.firsts: torch.Tensor | None = None  # [B]: each row's first window token it is fed
        self.slots: torch.Tensor | None = None  # [B, S]: where each window token is written
        self.positions: torch.Tensor | None = None  # [B, S]: each token's position, in the cache

    def begin(self, cache_lengths: torch.Tensor, input_lengths: torch.Tensor, steps: int) -> None:
        window = torch.arange(steps, device=cache_lengths.device)
        self.firsts = steps - input_lengths
        self.starts = cache_lengths - self.firsts
        unclamped = self.starts[:, None] + window[None, :]
        fed = window[None, :] >= self.firsts[:, None]
        # a token past the cache (a step queued after a row's last) goes to the padding's slot too
        self.slots = torch.where(fed, unclamped, self.length).clamp(min=0, max=self.length)
        self.positions = unclamped.clamp(min=0, max=self.length - 1)

    def write(self, keys, values, key_states, value_states) -> tuple:
        """key/value_states [R, Hkv, S, D] into the first R rows of the layer's buffers; those
        rows as the attention takes them, [R, Hkv, L + 1, D] views."""
        assert self.slots is not None, "begin() before the layers write"
        used = key_states.shape[0]
        rows = torch.arange(used, device=keys.device)[:, None].expand_as(self.slots)
        # [R, Hkv, S, D] -> [R, S, Hkv, D], the cache's layout; written through the whole buffer
        # (a write through a slice of it would be traced as a copy of the buffer)
        keys.index_put_((rows, self.slots), key_states.transpose(1, 2).to(keys.dtype))
        values.index_put_((rows, self.slots), value_states.transpose(1, 2).to(values.dtype))
        return keys[:used].transpose(1, 2), values[:used].transpose(1, 2)


def aotc_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    *args: Any,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple:
    """transformers' attention-function signature (AttentionInterface; the positional order of its
    own sdpa function, and whatever a later release adds in `*args, **kwargs`): query
    [B, Hq, S, D], key/value what the cache's `update` returned; (output [B, S, Hq, D], no
    weights). Checked against transformers 5.17.0 and 5.24.0."""
    # arguments that change what attention computes, which aotc's does not implement: refused
    # rather than ignored (the export's eager check would catch them too, less clearly)
    unsupported = [
        name for name in ("s_aux", "sinks", "position_bias") if kwargs.get(name) is not None
    ]
    if unsupported:
        raise UserInputError(
            f"{type(module).__name__} uses {unsupported[0]} in its attention, which aotc's "
            "generation attention does not implement; export it as one call instead: `aotc export "
            "MODEL --input-shape input_ids=1x16 --dtype int64`"
        )
    timeline = _active[-1]
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = cached_attention(
        query,
        key.transpose(1, 2),
        value.transpose(1, 2),
        timeline.starts,
        scale,
        int(sliding_window or 0),
        float(softcap or 0.0),
        timeline.firsts,
    )
    return out, None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, aotc_attention)


@contextlib.contextmanager
def owned_attention(model: Any, timeline: RowTimeline):
    """The model's layers call aotc's attention (and read the rows' `timeline`) inside."""
    _register()
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
    before = [c._attn_implementation for c in configs]
    _active.append(timeline)
    try:
        for config in configs:
            config._attn_implementation = IMPLEMENTATION
        yield
    finally:
        _active.pop()
        for config, name in zip(configs, before):
            config._attn_implementation = name


def additive_mask(timeline: RowTimeline, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, S, L + 1] the same reads as a mask (0 where read, the dtype's lowest elsewhere), for
    models whose attention takes the mask instead of the attention function."""
    assert timeline.starts is not None
    allowed = _allowed(timeline.starts, steps, timeline.length, 0)
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
    cache_argument = cache_keyword(model)

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
            cache = row_cache(self.cache("key_cache"), self.cache("value_cache"))
            timeline, steps = cache.timeline, input_ids.shape[1]
            timeline.begin(cache_lengths, input_lengths, steps)
            with owned_attention(self.model, timeline):
                out = self.model(
                    input_ids=input_ids,
                    position_ids=timeline.positions,
                    attention_mask=additive_mask(timeline, steps, self.model.dtype),
                    use_cache=True,
                    **{cache_argument: cache},
                    **last_only,
                )
            return out.logits[:, -1, :]

    return RowStep().eval()
