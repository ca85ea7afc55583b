"""Decoder LMs as one step of a generation loop over a static KV cache.

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

import dataclasses
import inspect
from typing import Any

from aotc.errors import UserInputError
from aotc.export.sibling_linears import fuse_sibling_linears
from aotc_runtime.generation import step_inputs  # one definition, the runtime's loop uses it

TASK = "text-generation"
# the step's inputs that grow with the tokens fed at once, and their axis
_S_AXES = (("input_ids", 1), ("position_ids", 1), ("cache_position", 0))


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


def cache_shape(model: Any) -> tuple[int, int]:
    """(key/value heads, head dim) of each layer's cache, as the model itself makes them: one
    eager step on one token with transformers' dynamic cache. Configs name these in many ways
    (num_key_value_heads, Falcon's num_kv_heads and multi_query, head_dim or none), and the keys'
    shape is what the attention writes, whatever the config calls it."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(
            input_ids=torch.zeros(1, 1, dtype=torch.long, device=device),
            past_key_values=cache,
            use_cache=True,
        )
    # keys [batch, heads, tokens, head dim], per layer
    shapes = {(layer.keys.shape[1], layer.keys.shape[-1]) for layer in cache.layers}
    if len(shapes) != 1:
        raise UserInputError(
            f"{type(model).__name__}'s layers cache keys of different shapes ({sorted(shapes)}); "
            "transformers' static cache, which generation packages use, holds one shape"
        )
    return shapes.pop()


def probe_step(model: Any) -> None:
    """One eager step on two tokens (what sibling_linears watches to find the siblings)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=device))


def cache_step(model: Any, batch_size: int, max_len: int):
    """`model` (a transformers *ForCausalLM, eval mode) as one step of generation, see above."""
    import torch
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

    check_supports_static_cache(model)
    fuse_sibling_linears(model, lambda: probe_step(model))  # q/k/v, gate/up: one GEMM each

    # The LM head on the last position only, as transformers' generate asks for it: on a prompt of
    # S tokens the head is otherwise S times the work and its logits S times the memory (a
    # 512-token prompt of a 128k vocabulary: 262 MB of fp32 logits of which one row is used).
    accepts = inspect.signature(model.forward).parameters
    last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}

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
            heads, head_dim = cache_shape(model)
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
                **last_logits_only,
            )
            return out.logits[:, -1, :]

    return CacheStep().eval()


def generation_export(loaded: Any, cfg: Any) -> tuple:
    """(the loaded model as a generation step, the dims of the example call, the artifact's task
    record) for `aotc export --task text-generation`: the user's model file as written, its
    example_inputs() replaced by a prompt of random ids."""
    import torch

    from aotc.export.shapes import DimSpec

    model, max_len, batch = loaded.module, cfg.max_seq_len, cfg.batch_size
    positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if positions is not None and max_len > positions:
        raise UserInputError(
            f"--max-seq-len {max_len} is more than the {positions} positions "
            f"{type(model).__name__} was made for (max_position_embeddings); use at most {positions}"
        )
    vocab = model.config.get_text_config().vocab_size
    if cfg.tokenizer is not None:
        check_tokenizer_vocabulary(cfg.tokenizer, vocab)
    check_cache_fits(model, batch, max_len)
    step = cache_step(model, batch, max_len)
    prompt = max(2, min(8, max_len // 2))  # the traced S: torch.export specializes 0 and 1

    def example_inputs():
        ids = torch.randint(0, vocab, (batch, prompt), generator=torch.Generator().manual_seed(0))
        mask = torch.ones(batch, prompt, dtype=torch.long)
        names = ("input_ids", "position_ids", "cache_position", "attention_mask")
        return dict(zip(names, step_inputs(ids, mask, 0, max_len)))

    wrapped = dataclasses.replace(loaded, module=step, example_inputs=example_inputs)
    dims = (DimSpec("S", 1, max_len, prompt, _S_AXES),)
    return wrapped, dims, task_record(model, cfg)


def read_tokenizer(folder: Any) -> str:
    """tokenizer.json of a transformers tokenizer folder, checked to be one `tokenizers` reads
    (the runtime loads it with that library: a JSON file, no code)."""
    from pathlib import Path

    from tokenizers import Tokenizer

    text = (Path(folder) / "tokenizer.json").read_text(encoding="utf-8")
    try:
        Tokenizer.from_str(text)
    except Exception as exc:  # the library's errors are plain Exceptions with its parser's text
        raise UserInputError(
            f"--tokenizer {folder}: tokenizer.json is not a tokenizer the `tokenizers` library "
            f"reads ({str(exc).splitlines()[0][:160]}); save it with a fast tokenizer"
        ) from None
    return text


def check_tokenizer_vocabulary(folder: Any, vocab: int) -> None:
    """The tokenizer must name the model's tokens: one that knows ids the model has not would feed
    it ids outside its embedding, and one that knows far fewer decodes most tokens to nothing.
    Trained models often round their vocabulary up past the tokenizer's (Qwen2.5: 151,936 rows
    for 151,665 tokens; Phi-3: 32,064 for 32,011), so a few percent fewer is expected."""
    from tokenizers import Tokenizer

    known = Tokenizer.from_str(read_tokenizer(folder)).get_vocab_size(with_added_tokens=True)
    if known > vocab or known < TOKENIZER_COVERAGE * vocab:
        raise UserInputError(
            f"--tokenizer {folder} knows {known} tokens, but the model has {vocab} "
            f"({'ids the model does not have' if known > vocab else 'most of its tokens would decode to nothing'}); "
            "export with the model's own tokenizer"
        )


TOKENIZER_COVERAGE = 0.95  # the least share of the model's vocabulary a tokenizer must know


def check_cache_fits(model: Any, batch: int, max_len: int) -> None:
    """Refuse a KV cache this machine cannot hold before it is allocated (a mistyped --batch-size
    would otherwise end the export with an allocation failure)."""
    import os

    heads, head_dim = cache_shape(model)
    layers = getattr(model.config.get_text_config(), "num_hidden_layers", 1)
    cache_bytes = 2 * layers * batch * heads * max_len * head_dim * model.dtype.itemsize
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if cache_bytes > memory:
        raise UserInputError(
            f"--batch-size {batch} with --max-seq-len {max_len} needs a KV cache of "
            f"{cache_bytes / 2**30:.1f} GiB, more than this machine's {memory / 2**30:.1f} GiB of "
            "memory; use a smaller --batch-size or --max-seq-len"
        )


def task_record(model: Any, cfg: Any) -> dict:
    """What the package's generation record holds. End-of-sequence and pad ids that the model's
    generation config names outside its vocabulary (a small config keeps its family's default,
    GPT2Config's 50256 say) are left out and listed under `ids_outside_vocabulary`: transformers
    only warns of them, the model can never make them, and the runtimes refuse a record holding
    them (aotc_runtime/generation_record.py)."""
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    pad = getattr(generation, "pad_token_id", None)
    vocab = model.config.get_text_config().vocab_size
    named = [int(e) for e in eos] + ([int(pad)] if pad is not None else [])
    outside = [token for token in named if not 0 <= token < vocab]
    record = {
        "name": TASK,
        "batch_size": cfg.batch_size,
        "max_seq_len": cfg.max_seq_len,
        "vocab_size": vocab,
        "eos_token_ids": [int(e) for e in eos if int(e) not in outside],
        "pad_token_id": None if pad is None or int(pad) in outside else int(pad),
        "tokenizer": cfg.tokenizer is not None,
        "sliding_window": attention_window(model.config.get_text_config()),
    }
    if outside:
        record["ids_outside_vocabulary"] = outside
    return record


def task_notes(task: dict | None) -> tuple[str, ...]:
    """What `aotc export` says of a task record beside the signature."""
    if not task or not task.get("ids_outside_vocabulary"):
        return ()
    ids = ", ".join(map(str, task["ids_outside_vocabulary"]))
    return (
        f"the model's generation config names token id(s) {ids} as end-of-sequence or pad, "
        f"outside its vocabulary (0..{task['vocab_size'] - 1}); the package leaves them out (the "
        "model never makes them); set generation_config.eos_token_id to stop at a token",
    )


def attention_window(config: Any) -> int:
    """The fewest earlier positions a layer of the model attends to (a sliding window, or
    Llama 4's attention chunks), 0 when every layer sees every earlier position. transformers
    measures such windows in cache positions, which serving's continuous batching must know
    (aotc_runtime/continuous.py)."""
    windows = []
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or ()
    if window and getattr(config, "use_sliding_window", True) is not False:
        # a config may name a window that none of its layers uses (layer_types all "full_attention")
        if not layer_types or any("sliding" in str(kind) for kind in layer_types):
            windows.append(int(window))
    if chunk := getattr(config, "attention_chunk_size", None):
        windows.append(int(chunk))
    return min(windows, default=0)


def check_cases(task: dict, device: Any) -> list:
    """The build's numeric check of a generation step: [(label, inputs)] in the order they run,
    the cache carried from one to the next as in generation: a prefill that fills the whole cache
    (S at its max), a prompt's prefill, decode steps after it, and a one-token prefill (S at its
    min). Each is called twice by the check; a step writes the same cache positions both times,
    so the second call sees what the first did."""
    import torch

    batch, max_len, vocab = task["batch_size"], task["max_seq_len"], task["vocab_size"]
    g = torch.Generator().manual_seed(0)

    def prompt(length: int):
        return torch.randint(0, vocab, (batch, length), generator=g)

    def case(label: str, ids, mask, start: int):
        return label, [t.to(device) for t in step_inputs(ids, mask, start, max_len)]

    ones = lambda n: torch.ones(batch, n, dtype=torch.long)  # noqa: E731
    length = max(2, min(8, max_len // 2))
    cases = [
        case(f"prefill of {max_len} tokens (S at its max)", prompt(max_len), ones(max_len), 0),
        case(f"prefill of {length} tokens", prompt(length), ones(length), 0),
    ]
    for step in range(min(4, max_len - length)):
        seen = length + step + 1
        cases.append(case(f"decode step {step + 1}", prompt(1), ones(seen), seen - 1))
    cases.append(case("prefill of 1 token (S at its min)", prompt(1), ones(1), 0))
    return cases
