"""Decoder LMs as one step of a generation loop over a static KV cache (issue 26, first part).

A transformers `*ForCausalLM` generates by calling itself once on the prompt (prefill) and then
once per new token (decode), each call reading and extending its key/value cache. `CacheStep` is
that call as a module torch.export can capture:

    step(input_ids [B, S], position_ids [B, S], cache_position [S], attention_mask [B, max_len])
        -> logits of the last position [B, vocab]

- The cache is transformers' `StaticCache` (fixed size: batch x max_len), its tensors registered
  as this module's buffers. The program writes them in place, so an export records them as
  mutated buffers: aotc's state, which the runtime carries from one call to the next.
- `cache_position` says where the S new tokens go; the cache's own write counter is set from it
  at each call, so a call depends on its inputs and the cache contents only.
- `attention_mask` covers the whole cache (1 where a position holds a real token): a batch of
  prompts of different lengths, padded, is answered as transformers' batched `generate` answers it.
- `position_ids` are the tokens' positions in their own sequence (they differ from
  `cache_position` under left padding), as `generate` computes them from the mask.

Prefill is S = the prompt's length, decode S = 1: one exported program with S dynamic serves both.
The idea of registering a static cache's tensors as buffers is transformers'
(`transformers.integrations.executorch.TorchExportableModuleWithStaticCache`); that module leaves
the cache layers pointing at the original tensors, which torch.export then captures as constants
that the graph mutates (refused once the program is functionalized), so here each call points
them at the buffers as export sees them.
"""

from __future__ import annotations

from typing import Any

from aotc.errors import UserInputError


def check_supports_static_cache(model: Any) -> None:
    """Refuse, in one line, a model transformers cannot run with a static cache."""
    name = type(model).__name__
    if not hasattr(model, "generation_config") or not hasattr(model, "config"):
        raise UserInputError(
            f"{name} is not a transformers model with a generation config; --task text-generation "
            "takes a *ForCausalLM"
        )
    if not getattr(type(model), "_can_compile_fullgraph", False):
        raise UserInputError(
            f"{name} does not support transformers' static KV cache (its class does not set "
            "_can_compile_fullgraph), which generation packages need; export it without --task"
        )


def cache_shape(config: Any) -> tuple[int, int]:
    """(key/value heads, head dim) of each layer's cache."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return heads, head_dim


def cache_step(model: Any, batch_size: int, max_len: int):
    """`model` (a transformers *ForCausalLM, eval mode) as one step of generation, see above."""
    import torch
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

    check_supports_static_cache(model)

    class CacheStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.cache = StaticCache(config=model.config, max_cache_len=max_len)
            # A sliding-window layer keeps only the window and rolls it, with branches on the
            # position that a trace fixes. Every position kept instead: the attention mask, which
            # transformers builds from the config's window, still limits each token to its window.
            for i, layer in enumerate(self.cache.layers):
                if isinstance(layer, StaticSlidingWindowLayer):
                    self.cache.layers[i] = StaticLayer(max_len)
            heads, head_dim = cache_shape(model.config)
            device = next(model.parameters()).device
            # allocated now: lazily, on the first call, it would happen inside the trace
            self.cache.early_initialization(batch_size, heads, head_dim, model.dtype, device)
            self.layers = len(self.cache.layers)
            for i, layer in enumerate(self.cache.layers):
                self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
                self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
                self.register_buffer(f"cache_length_{i}", layer.cumulative_length, persistent=False)

        def forward(self, input_ids, position_ids, cache_position, attention_mask):
            for i, layer in enumerate(self.cache.layers):
                layer.keys = getattr(self, f"key_cache_{i}")
                layer.values = getattr(self, f"value_cache_{i}")
                layer.cumulative_length = getattr(self, f"cache_length_{i}")
                layer.cumulative_length.copy_(cache_position[0])  # where this call writes
            out = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=attention_mask,
                past_key_values=self.cache,
                cache_position=cache_position,
                use_cache=True,
            )
            return out.logits[:, -1, :]

    return CacheStep().eval()


def step_inputs(input_ids, attention_mask, start: int, max_len: int) -> tuple:
    """The inputs of one step that feeds the tokens `input_ids` [B, S] at cache positions start..
    start+S-1, where `attention_mask` [B, start+S] marks the real tokens so far (padding 0)."""
    import torch

    batch, length = input_ids.shape
    seen = attention_mask.shape[1]
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, seen - length :]
    full_mask = torch.zeros(batch, max_len, dtype=torch.long, device=input_ids.device)
    full_mask[:, :seen] = attention_mask
    cache_position = torch.arange(start, start + length, device=input_ids.device)
    return input_ids, positions.contiguous(), cache_position, full_mask
