"""The generation step (aotc/export/text_generation.py, row_cache.py), exported with torch.export
and run as a greedy loop, against transformers' own `generate` on the same weights: the zoo's
decoder LMs, token for token and logits within fp32 rounding, for a batch of two prompts of
different lengths (left-padded, as `generate` pads a decoder-only batch; the step is fed each
row's own tokens, packed). The exported program is
run eagerly here, with aotc's attention as each build lowers it (cached_attention.py); what a step
reads of the cache is counted, not timed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from aotc.errors import UserInputError
from aotc.export.cached_attention import lower_cached_attention
from aotc.export.text_generation import cache_step, check_supports_static_cache
from aotc_runtime.decode_step import pack
from aotc_runtime.generation import prefill_inputs

ZOO = Path(__file__).parent / "zoo"
MAX_LEN = 32
NEW_TOKENS = 8


def zoo_model(name: str):
    spec = importlib.util.spec_from_file_location(name, ZOO / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.get_model().eval()
    # random weights at the default scale give near-uniform logits and a repeated token; larger
    # ones give a varied sequence, which makes the comparison mean something
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model, module.VOCAB


def left_padded_prompts(vocab: int) -> tuple:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    ids[1, :3], mask[1, :3] = 0, 0  # the second prompt is 4 tokens long
    return ids, mask


def export_step(model):
    step = cache_step(model, batch_size=2, max_len=MAX_LEN)
    ids, mask = left_padded_prompts(model.config.vocab_size)
    example = prefill_inputs(ids, mask)
    t = torch.export.Dim("T", min=1, max=2 * MAX_LEN)
    shapes = ({0: t}, {0: t}, {0: t}, None)
    return torch.export.export(step, tuple(example), dynamic_shapes=shapes, strict=False)


def greedy(program, ids, mask) -> tuple:
    """(new tokens [B, NEW_TOKENS], each step's logits) from the exported step, prefill then decode."""
    logits = program(*prefill_inputs(ids, mask))
    held = mask.sum(-1).tolist()
    tokens, scores = [logits.argmax(-1)], [logits]
    for _ in range(NEW_TOKENS - 1):
        feeds = [(row, held[row], [int(tokens[-1][row])]) for row in range(len(held))]
        logits = program(*pack(feeds))
        held = [h + 1 for h in held]
        tokens.append(logits.argmax(-1))
        scores.append(logits)
    return torch.stack(tokens, 1), scores


@pytest.mark.parametrize("lowering", ["reference", "prefix"])
@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "mistral", "mistral-window-4"])
def test_the_exported_step_generates_what_transformers_generates(name, lowering):
    model, vocab = zoo_model(name.split("-")[0])
    if name.endswith("window-4"):  # a window shorter than prompt + new tokens: the mask limits it
        model.config.sliding_window = 4
    ep = export_step(model)
    # the cache is state: functionalized, the program writes the cache buffers and no constant
    mutated = set(ep.run_decompositions({}).graph_signature.buffers_to_mutate.values())
    layers = model.config.num_hidden_layers
    assert mutated == {f"{kind}_{i}" for kind in ("key_cache", "value_cache")
                       for i in range(layers)}  # fmt: skip
    ep = lower_cached_attention(ep, lowering)

    ids, mask = left_padded_prompts(vocab)
    with torch.no_grad():
        expected = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,  # no early stop at a random eos
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_logits=True,  # raw: scores are after processors (min_new_tokens masks eos)
        )
        got, scores = greedy(ep.module(), ids, mask)
    assert got.tolist() == expected.sequences[:, ids.shape[1] :].tolist()
    assert len(set(got.flatten().tolist())) > 2, "a degenerate sequence tests little"
    for ours, theirs in zip(scores, expected.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_a_model_without_static_cache_support_is_refused_in_one_line():
    class NotAnLM(torch.nn.Module):
        generation_config = None
        config = None

    with pytest.raises(UserInputError) as error:
        check_supports_static_cache(NotAnLM())
    assert "static KV cache" in str(error.value) and "\n" not in str(error.value)


class PositionsRead(torch.utils._python_dispatch.TorchDispatchMode):
    """The cache positions each attention reads: the key length of every attention it runs."""

    def __init__(self):
        super().__init__()
        self.lengths: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "scaled_dot_product" in name or "_scaled_dot_product" in name:
            self.lengths.append(args[1].shape[-2])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("lowering, grows", [("prefix", False), ("reference", True)])
def test_a_steps_reads_grow_with_its_context_not_with_the_cache(lowering, grows):
    """64 tokens in context: the CPU's attention (prefix) reads 65 positions a layer whether the
    cache holds 256 or 4,096; the reference reads the whole cache, both rows end to end."""
    model, vocab = zoo_model("llama")
    model.config.max_position_embeddings = 4096
    read = {}
    for max_len in (256, 4096):
        step = cache_step(model, batch_size=2, max_len=max_len)
        example = pack([(0, 0, torch.randint(0, vocab, (8,)).tolist()), (1, 0, [1, 2, 3])])
        t = torch.export.Dim("T", min=1, max=2 * max_len)
        shapes = ({0: t}, {0: t}, {0: t}, None)
        ep = torch.export.export(step, tuple(example), dynamic_shapes=shapes, strict=False)
        program = lower_cached_attention(ep, lowering).module()
        with torch.no_grad(), PositionsRead() as counter:
            program(*pack([(0, 64, [5]), (1, 40, [6])]))
        assert len(counter.lengths) == model.config.num_hidden_layers
        read[max_len] = set(counter.lengths)
    if grows:
        assert read == {256: {2 * 257}, 4096: {2 * 4097}}
    else:
        assert read == {256: {65}, 4096: {65}}
