"""A transformers decoder LM as one step of generation over aotc's own KV cache, in which every
row (sequence) has its own timeline and a step's tokens are packed:

    step(input_ids [T], rows [T], positions [T], picks [R]) -> logits [R, vocab]

- Token t is row rows[t]'s token at position positions[t]: its keys and values are written there,
  and it attends to the row's positions up to its own. A row's tokens in one step sit at
  consecutive positions, one after another in the list. The logits are those of tokens picks[r].
- Prefill, a chunk of a long prompt, and decode are the same program with T dynamic, and one step
  may do all three for different rows: a sequence joins a running batch in the step that decodes
  the others (aotc_runtime/decode_engine.py), and each token costs the step its own projections
  and MLP only, never a padded window's.
- The cache is one pair of buffers per layer, [B, max_len + 1, kv heads, head dim], mutated in
  place (the package's state). A token at position max_len (or past it) is no row's: it is
  written to slot max_len, which is never read, and reads nothing. A decode step replayed as a
  CUDA graph feeds every row a token and a free row this way.
- Out-of-range rows, positions and picks are clamped into the buffers: a wrong input gives wrong
  logits, never a write outside the cache.

transformers' hooks put aotc in charge of both halves of attention: `row_cache` is the `Cache`
the model's layers call `update` on (the write), and "aotc" is the attention implementation they
call after it (the read), registered in transformers' `AttentionInterface`; it is the
`aotc::cached_attention` operator (cached_attention.py), which each build lowers for its device.
The model sees the packed tokens as one sequence of T tokens (batch 1) at the given position ids.
A model whose attention does not go through that interface (Falcon) gets a 4-D mask over the
whole cache, its rows end to end, with the same meaning, and reads it with its own attention.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from aotc.errors import UserInputError
from aotc.export.cached_attention import cached_attention, packed_allowed
from aotc.export.transformers_release import cache_keyword

IMPLEMENTATION = "aotc"
STEP_INPUTS = ("input_ids", "rows", "positions", "picks")

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

    timeline = RowTimeline(keys[0].shape[0], keys[0].shape[1] - 1)
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
        token's row and position; the attention is handed the whole buffers."""

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
    """Where the step's tokens go in the cache: set once by `begin`, read by every layer's write
    and by the attention."""

    def __init__(self, batch: int, length: int):
        self.batch = batch
        self.length = length  # slot `length` is the padding's
        self.rows: torch.Tensor | None = None  # [T]: each token's row
        self.positions: torch.Tensor | None = None  # [T]: each token's position, `length`: none
        self.slots: torch.Tensor | None = None  # [T]: where each token is written

    def begin(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        self.rows = rows.clamp(min=0, max=self.batch - 1)
        self.positions = positions.clamp(min=0, max=self.length)
        self.slots = self.positions  # a token that is no row's goes to the padding's slot

    def position_ids(self) -> torch.Tensor:
        """[1, T] the model's position ids (a token that is no row's at the last real one, so a
        learned position table is never read past its end)."""
        assert self.positions is not None, "begin() first"
        return self.positions.clamp(max=self.length - 1)[None]

    def write(self, keys, values, key_states, value_states) -> tuple:
        """key/value_states [1, Hkv, T, D] into each token's row and slot of the layer's buffers;
        the whole buffers as the attention takes them: one sequence of B * (L + 1) slots, its rows
        end to end, [1, Hkv, B * (L + 1), D] (a view)."""
        assert self.slots is not None, "begin() before the layers write"
        # [1, Hkv, T, D] -> [T, Hkv, D], the cache's layout; written through the whole buffer
        # (a write through a slice of it would be traced as a copy of the buffer)
        keys.index_put_((self.rows, self.slots), key_states[0].transpose(0, 1).to(keys.dtype))
        values.index_put_((self.rows, self.slots), value_states[0].transpose(0, 1).to(values.dtype))
        return _as_one_sequence(keys), _as_one_sequence(values)


def _as_one_sequence(cache: torch.Tensor) -> torch.Tensor:
    batch, slots, heads, dim = cache.shape
    return cache.view(1, batch * slots, heads, dim).transpose(1, 2)


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
    [1, Hq, T, D], key/value what the cache's `update` returned (the whole buffers as one
    sequence); (output [1, T, Hq, D], no weights). Checked against transformers 5.17.0 and
    5.24.0."""
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
    buffer = (timeline.batch, timeline.length + 1, key.shape[1], key.shape[-1])
    out = cached_attention(
        query,
        key.transpose(1, 2).reshape(buffer),
        value.transpose(1, 2).reshape(buffer),
        timeline.rows,
        timeline.positions,
        scale,
        int(sliding_window or 0),
        float(softcap or 0.0),
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


def additive_mask(timeline: RowTimeline, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, T, B * (L + 1)] the same reads as a mask over the whole cache, its rows end to end
    (0 where read, the dtype's lowest elsewhere), for models whose attention takes the mask
    instead of the attention function."""
    assert timeline.rows is not None and timeline.positions is not None
    allowed = packed_allowed(timeline.rows, timeline.positions, timeline.batch, timeline.length, 0)
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    lowest = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, lowest)[None, None]


def row_step(model: Any, batch_size: int, max_len: int, heads: int, head_dim: int):
    """`model` (a transformers *ForCausalLM, eval mode) as one step over aotc's cache, see above."""
    import inspect

    layers = model.config.get_text_config().num_hidden_layers
    device = next(model.parameters()).device
    accepts = inspect.signature(model.forward).parameters
    # the LM head on the picked tokens only, as transformers' generate asks for the last one
    picks_only = "logits_to_keep" in accepts
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

        def forward(self, input_ids, rows, positions, picks):
            cache = row_cache(self.cache("key_cache"), self.cache("value_cache"))
            timeline = cache.timeline
            timeline.begin(rows, positions)
            picks = picks.clamp(min=0, max=input_ids.shape[0] - 1)
            chosen = {"logits_to_keep": picks} if picks_only else {}
            with owned_attention(self.model, timeline):
                out = self.model(
                    input_ids=input_ids[None],
                    position_ids=timeline.position_ids(),
                    attention_mask=additive_mask(timeline, self.model.dtype),
                    use_cache=True,
                    **{cache_argument: cache},
                    **chosen,
                )
            logits = out.logits[0]
            return logits if picks_only else logits[picks]

    return RowStep().eval()
