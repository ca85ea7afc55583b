"""Decoder LMs as one step of a generation loop over aotc's own KV cache (row_cache.py):

    step(input_ids [T], rows [T], positions [T], picks [R]) -> logits [R, vocab]

Each row of the batch is a sequence with its own timeline, and a step's tokens are packed: token
t goes to row rows[t] at position positions[t], and the logits are those of tokens picks[r]. T is
dynamic (1 to every row's whole cache), so one exported program serves prefill, decode and a step
that prefills some rows while it decodes others, at the cost of the tokens it feeds. R is dynamic
from 1 to the batch (a batch of 3 or more), so a step picks the logits of the rows that need a
token only. The cache's buffers are mutated in place: an export records them as mutated buffers,
aotc's state, which the runtime carries from one call to the next. Attention is aotc's
`cached_attention` operator, which reads only the positions a token's row has filled
(cached_attention.py); the export checks it against the model's own attention before tracing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aotc.errors import ModelError, UserInputError
from aotc.export.row_cache import STEP_INPUTS
from aotc.export.sibling_linears import fuse_sibling_linears
from aotc.export.transformers_release import cache_keyword, hooks_guard, warn_if_untested
from aotc_runtime.decode_step import pack
from aotc_runtime.generation import prefill_inputs  # one definition, the runtime's loop uses it
from aotc_runtime.generation_record import STEP_FORMAT  # the contract the runtimes run

TASK = "text-generation"
# the step's inputs that grow with the tokens fed at once, and their axis
TOKENS_DIM = "T"
_T_AXES = (("input_ids", 0), ("rows", 0), ("positions", 0))
# the logits a step picks, R <= the batch (row_cache.py)
ROWS_DIM = "R"
_R_AXES = (("picks", 0),)


def one_call_command(target: str) -> str:
    """The export that works for a causal LM generation packages cannot hold: the model as one
    call on a fixed prompt, its KV cache output left out (trace.cache_output_off)."""
    return f"`aotc export {target} --input-shape input_ids=1x16 --dtype int64`"


def check_supports_static_cache(model: Any, target: str = "MODEL") -> None:
    """Refuse, in one line, a model transformers cannot run with a static cache."""
    name = type(model).__name__
    if not hasattr(model, "generation_config") or not hasattr(model, "config"):
        raise UserInputError(
            f"{name} is not a transformers model with a generation config; --task text-generation "
            "takes a *ForCausalLM"
        )
    if not getattr(type(model), "_can_compile_fullgraph", False):
        # GPTNeo, among others: its attention is its own code, not transformers' attention
        # functions, which aotc's KV cache replaces
        raise UserInputError(
            f"{name} cannot run over a static KV cache (transformers marks the class "
            "_can_compile_fullgraph = False), which generation packages need; export it as one "
            f"call on a fixed-length prompt instead: {one_call_command(target)}"
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
            use_cache=True,
            **{cache_keyword(model): cache},
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


def cache_step(model: Any, batch_size: int, max_len: int, target: str = "MODEL"):
    """`model` (a transformers *ForCausalLM, eval mode) as one step of generation, see above.
    `target`: the model as the user named it, for the command a refusal names."""
    from aotc.export.row_cache import row_step

    check_supports_static_cache(model, target)
    with hooks_guard(model):  # every call below goes through transformers' model code
        fuse_sibling_linears(model, lambda: probe_step(model))  # q/k/v, gate/up: one GEMM each
        heads, head_dim = cache_shape(model)
        step = row_step(model, batch_size, max_len, heads, head_dim)
        check_owned_attention(model, step, max_len, target)
    step.zero_cache()
    return step


def check_owned_attention(model: Any, step: Any, max_len: int, target: str = "MODEL") -> None:
    """aotc's attention against the model's own, eagerly: a prompt's prefill and two decode steps
    on the first row, through transformers' own cache and attention and through the step. A model
    whose layers do something with attention that aotc's does not would disagree here, in one
    line, rather than generate other tokens from the package."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    vocab = model.config.get_text_config().vocab_size
    batch = step.key_cache_0.shape[0]
    length = max(1, min(6, max_len - 2))
    ids = torch.randint(0, vocab, (1, length + 2), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    own, ours = [], []
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        for start, end in ((0, length), (length, length + 1), (length + 1, length + 2)):
            out = model(
                input_ids=ids[:, start:end], use_cache=True, **{cache_keyword(model): cache}
            )
            own.append(out.logits[0, -1].float())
        held = 0
        for start, end in ((0, length), (length, length + 1), (length + 1, length + 2)):
            # every row fed the same tokens, so the cache's rows are all written and read
            chunk = ids[0, start:end].tolist()
            feeds = [(row, held, chunk) for row in range(batch)]
            inputs = [t.to(device) for t in pack(feeds)]
            ours.append(step(*inputs)[0].float())
            held += end - start
    if not all(bool(logits.isfinite().all()) for logits in own):
        # the model's own code, before aotc changes anything: not aotc's attention
        raise ModelError(
            f"{type(model).__name__}'s own logits are not finite (NaN or infinite) on a "
            f"{length}-token prompt, before aotc changes anything: its weights or its config "
            "hold NaN, or values that overflow its dtype; check the checkpoint (or export it in "
            "float32: --dtype float32)"
        )
    # fp32 rounding apart; a half-precision model's logits round at a few parts in a hundred
    tolerance = 1e-3 if model.dtype.itemsize >= 4 else 5e-2
    for which, (a, b) in enumerate(zip(own, ours)):
        gap = float((a - b).abs().max() / a.abs().max().clamp(min=1.0))
        if not gap <= tolerance:
            what = "the prompt" if which == 0 else f"decode step {which}"
            raise UserInputError(
                f"aotc's attention disagrees with {type(model).__name__}'s own on {what} "
                f"(largest logit difference {gap:.2g} of the largest logit); this model's attention "
                "is not one aotc's generation packages implement: export it as one call instead: "
                f"{one_call_command(target)}"
            )


def generation_export(loaded: Any, cfg: Any, extras: Any = None) -> tuple:
    """(the loaded model as a generation step, the dims of the example call, the artifact's task
    record) for `aotc export --task text-generation`: the user's model file as written, its
    example_inputs() replaced by a prompt of random ids. `extras`: the tokenizer folder's chat
    template and special tokens (tokenizer_folder.TokenizerExtras), recorded in the task."""
    import torch

    from aotc.export.shapes import DimSpec

    model, max_len = loaded.module, cfg.max_seq_len
    warn_if_untested()
    check_supports_static_cache(model, cfg.model)  # before anything is measured or allocated
    if cfg.batch_size is None:
        cfg = dataclasses.replace(cfg, batch_size=default_batch_size(model, max_len))
    batch = cfg.batch_size
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
    step = cache_step(model, batch, max_len, cfg.model)
    # the traced tokens: every row a prompt of `prompt` tokens. torch.export specializes sizes 0
    # and 1 and unifies equal ones, so T (batch x prompt) and R (batch) must differ and exceed 1
    prompt = max(2, min(8, max_len // 2))

    def example_inputs():
        ids = torch.randint(0, vocab, (batch, prompt), generator=torch.Generator().manual_seed(0))
        mask = torch.ones(batch, prompt, dtype=torch.long)
        return dict(zip(STEP_INPUTS, prefill_inputs(ids, mask)))

    wrapped = dataclasses.replace(loaded, module=step, example_inputs=example_inputs)
    dims = (DimSpec(TOKENS_DIM, 1, batch * max_len, batch * prompt, _T_AXES),)
    if batch >= 3:
        # traced at the whole batch. torch.export traces a dynamic size as at least 2 (it
        # specializes 0 and 1), so a batch of 2 would be a range of one size: its picks stay static
        dims += (DimSpec(ROWS_DIM, 1, batch, batch, _R_AXES),)
    return wrapped, dims, task_record(model, cfg, extras)


def read_tokenizer(folder: Any) -> str:
    """tokenizer.json of a transformers tokenizer folder, checked to be one `tokenizers` reads
    (the runtime loads it with that library: a JSON file, no code)."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer

    from aotc.export.folder_json import read_bounded_text
    from aotc_runtime import tokenizer_growth_problem

    fix = "save it with a fast tokenizer (tokenizer.save_pretrained)"
    text = read_bounded_text(Path(folder) / "tokenizer.json", MAX_TOKENIZER_BYTES, fix)
    try:
        problem = tokenizer_growth_problem(json.loads(text))
    except (ValueError, RecursionError):
        problem = None  # not JSON: the library's own error below says so
    if problem is not None:
        raise UserInputError(
            f"the tokenizer in {folder}: {problem}; export with the model's own tokenizer"
        )
    try:
        Tokenizer.from_str(text)
    except Exception as exc:  # the library's errors are plain Exceptions with its parser's text
        raise UserInputError(
            f"the tokenizer in {folder}: tokenizer.json is not a tokenizer the `tokenizers` library "
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
            f"the tokenizer in {folder} knows {known} tokens, but the model has {vocab} "
            f"({'ids the model does not have' if known > vocab else 'most of its tokens would decode to nothing'}); "
            "export with the model's own tokenizer"
        )


TOKENIZER_COVERAGE = 0.95  # the least share of the model's vocabulary a tokenizer must know
MAX_TOKENIZER_BYTES = 256 << 20  # as the artifact holds it (artifact.py); real ones: 2-30 MiB


# Without --batch-size: the rows `aotc serve` runs at once (continuous batching), as many as keep
# the KV cache within DEFAULT_CACHE_BYTES. A row nothing is fed costs a step little: its attention
# reads nothing, and on a GPU the step's weights are read once for all rows.
DEFAULT_BATCH_SIZE = 8
DEFAULT_CACHE_BYTES = 1 << 30


def cache_bytes(model: Any, batch: int, max_len: int) -> int:
    heads, head_dim = cache_shape(model)
    layers = getattr(model.config.get_text_config(), "num_hidden_layers", 1)
    return 2 * layers * batch * heads * max_len * head_dim * model.dtype.itemsize


def default_batch_size(model: Any, max_len: int) -> int:
    """DEFAULT_BATCH_SIZE rows, halved until their KV cache fits DEFAULT_CACHE_BYTES (at least 1)."""
    batch = DEFAULT_BATCH_SIZE
    while batch > 1 and cache_bytes(model, batch, max_len) > DEFAULT_CACHE_BYTES:
        batch //= 2
    return batch


def check_cache_fits(model: Any, batch: int, max_len: int) -> None:
    """Refuse a KV cache this machine cannot hold before it is allocated (a mistyped --batch-size
    would otherwise end the export with an allocation failure)."""
    import os

    cache = cache_bytes(model, batch, max_len)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if cache > memory:
        raise UserInputError(
            f"--batch-size {batch} with --max-seq-len {max_len} needs a KV cache of "
            f"{cache / 2**30:.1f} GiB, more than this machine's {memory / 2**30:.1f} GiB of "
            "memory; use a smaller --batch-size or --max-seq-len"
        )


def task_record(model: Any, cfg: Any, extras: Any = None) -> dict:
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
        "step_format": STEP_FORMAT,
        "batch_size": cfg.batch_size,
        "max_seq_len": cfg.max_seq_len,
        "vocab_size": vocab,
        "eos_token_ids": [int(e) for e in eos if int(e) not in outside],
        "pad_token_id": None if pad is None or int(pad) in outside else int(pad),
        "tokenizer": cfg.tokenizer is not None,
        "sliding_window": attention_window(model.config.get_text_config()),
        # the template travels as an artifact entry; the build names its package file
        "chat_template": extras is not None and extras.chat_template is not None,
        "special_tokens": dict(extras.special_tokens) if extras is not None else {},
        "sampling_defaults": sampling_defaults(generation),
    }
    if outside:
        record["ids_outside_vocabulary"] = outside
    return record


def sampling_defaults(generation: Any) -> dict:
    """How transformers' `generate` samples this model when asked nothing (its generation_config,
    the folder's generation_config.json for a saved folder): greedy unless `do_sample`, then its
    temperature, top-k, top-p and min-p; its repetition penalty either way. A value outside the
    runtime's ranges is left out (its default stands)."""
    from aotc_runtime.sampling_settings import InvalidSampling, Sampling

    if generation is None:
        return {}
    found: dict = {}
    if getattr(generation, "do_sample", False):
        # what `generate` applies where the config leaves a value unset (transformers 5 keeps
        # unset values None): temperature 1.0, top-k 50, top-p 1.0
        unset = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None}
        for key, default in unset.items():
            value = getattr(generation, key, None)
            found[key] = default if value is None else value
    else:
        found["temperature"] = 0.0
    found["repetition_penalty"] = getattr(generation, "repetition_penalty", None)
    kept = {}
    for key, value in found.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        value = int(value) if key == "top_k" else float(value)
        try:
            Sampling(**{key: value})
        except InvalidSampling:
            continue  # a value the runtime refuses: the request's default is used instead
        kept[key] = value
    if kept.get("repetition_penalty") == 1.0:
        del kept["repetition_penalty"]  # none
    return kept


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
    (aotc_runtime/decode_engine.py)."""
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


# The most tokens one call of the check's long-context cases feeds: the build's check of a real
# model stays a fraction of its compile (docs/development.md has the figures).
CHECK_TOKENS_PER_CALL = 1024


def check_cases(task: dict, device: Any) -> list:
    """The build's numeric check of a generation step: [(label, inputs)] in the order they run,
    the cache carried from one to the next as in generation: the cache's whole length (below),
    prompts of different lengths, decode steps after them, a step that prefills one row while it
    decodes the others, a decode step in which a row is fed nothing (a free row, as a CUDA graph
    feeds it), a decode of the first row alone (R at its min), and a one-token step (T at its
    min). A step writes the same cache positions on each call, so a second call (a CUDA-graph
    package's replay) sees what the first did.

    The whole length: a prefill of every row to the cache's end where that costs at most
    CHECK_TOKENS_PER_CALL tokens. Past that (a real model's 8 rows x 2,048 positions), the
    positions that show a wrong cache index or mask are reached without computing the rest: a
    chunk at the cache's start, a chunk that ends one short of its end, and a decode of its last
    position, whose attention reads every position, the chunks' and the zeros between them."""
    import torch

    batch, max_len, vocab = task["batch_size"], task["max_seq_len"], task["vocab_size"]
    picks = None if batch >= 3 else batch  # a batch of 1 or 2 picks every row's logits
    g = torch.Generator().manual_seed(0)

    def tokens(length: int) -> list:
        return torch.randint(0, vocab, (length,), generator=g).tolist()

    def case(label: str, feeds: list, fixed: int | None = picks):
        return label, [t.to(device) for t in pack(feeds, fixed)]

    chunk = max(2, CHECK_TOKENS_PER_CALL // batch)
    if chunk >= max_len:
        cases = [case(f"prefill of {max_len} tokens in every row (the cache's whole length)",
                      [(row, 0, tokens(max_len)) for row in range(batch)])]  # fmt: skip
    else:
        far = max_len - 1 - chunk
        cases = [
            case(f"prefill of {chunk} tokens at the cache's start",
                 [(row, 0, tokens(chunk)) for row in range(batch)]),
            case(f"prefill of {chunk} tokens at positions {far}-{max_len - 2}",
                 [(row, far, tokens(chunk)) for row in range(batch)]),
            case(f"decode of the cache's last position ({max_len - 1}), reading all {max_len}",
                 [(row, max_len - 1, tokens(1)) for row in range(batch)]),
        ]  # fmt: skip
    length = max(2, min(8, max_len // 2))
    # each row's prompt: the first `length` tokens, the others one fewer down to 1
    prompts = [max(1, length - row) for row in range(batch)]
    cases.append(case(f"prefill of prompts of {min(prompts)}-{length} tokens",
                      [(row, 0, tokens(p)) for row, p in enumerate(prompts)]))  # fmt: skip
    held = list(prompts)
    for step in range(min(3, max_len - length - 1)):
        cases.append(case(f"decode step {step + 1}",
                          [(row, held[row], tokens(1)) for row in range(batch)]))  # fmt: skip
        held = [h + 1 for h in held]
    if batch >= 2 and max_len - max(held) >= 1:
        # the last row fed nothing: its token at position max_len, no row's (how a decode step
        # replayed as a CUDA graph feeds a free row); the others decode, their logits picked
        free = batch - 1
        feeds = [(row, held[row] if row != free else max_len, tokens(1)) for row in range(batch)]
        cases.append(case("a decode step beside a row fed nothing", feeds))
        held = [h + (row != free) for row, h in enumerate(held)]
    if picks is None and max_len - held[0] >= 2:
        # one token, the first row's logits alone (T and R at their min): what a runtime feeds
        # when the other rows are free
        cases.append(case("decode of the first row alone (T and R at their min)",
                          [(0, held[0], tokens(1))]))  # fmt: skip
        held[0] += 1
    if max_len - max(held) >= 2:  # row 0 takes a new 2-token prompt while the others decode
        feeds = [(0, 0, tokens(2))] + [(row, held[row], tokens(1)) for row in range(1, batch)]
        cases.append(case("a row's prefill beside the others' decode", feeds))
    cases.append(
        case("prefill of 1 token in every row", [(row, 0, tokens(1)) for row in range(batch)])
    )
    return cases
