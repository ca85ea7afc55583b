"""Text-generation packages: `aotc export --task text-generation`, `aotc build`, then
`Package.generate`, against transformers' own `generate` on the same weights (CPU, fp32).

The zoo's small LMs, with their weights scaled up (conftest.py's `generation_packages`: each
exported once, batch 2 and a 32-token cache, and built once per session).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from conftest import GENERATION_FAMILIES, invoke

import aotc_runtime
from aotc.compiler.tolerances import GENERATION
from aotc_runtime.errors import GenerationInputError, PackageError

pytestmark = pytest.mark.slow
FAMILIES = GENERATION_FAMILIES


@pytest.fixture(scope="module", autouse=True)
def build_ahead(request, generation_packages):
    """The families the selected tests of the token-for-token comparison load, built two at a time
    from the module's start (conftest's BuildAhead)."""
    wanted = set()
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is request.module and "family" in params:
            wanted.add(params["family"])
    generation_packages.prefetch(family for family in FAMILIES if family in wanted)


def prompts(vocab: int = 512) -> tuple:
    """Two prompts, the second 4 tokens long and left-padded to the first's 7."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    ids[1, :3], mask[1, :3] = 0, 0
    return ids, mask


def reference(model, ids, mask, new_tokens: int, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(
            ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, **kwargs
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_transformers_generate(generation_packages, family):
    package, model = generation_packages[family]
    ids, mask = prompts()
    expected = reference(model, ids, mask, 16, min_new_tokens=16, pad_token_id=0)
    got = aotc_runtime.load(package).generate(ids, mask, max_new_tokens=16, eos_token_ids=[])
    assert got.tolist() == expected.tolist()
    assert len(set(got[:, 7:].flatten().tolist())) > 4, "a degenerate sequence tests little"


def test_fewer_prompts_than_the_batch_are_answered_as_if_alone(generation_packages):
    package, model = generation_packages["gpt2"]
    ids, _mask = prompts()
    alone = ids[1:, 3:]  # the second prompt without its padding
    expected = reference(model, alone, torch.ones_like(alone), 10, min_new_tokens=10)
    got = aotc_runtime.load(package).generate(alone, max_new_tokens=10, eos_token_ids=[])
    assert got.tolist() == expected.tolist()


def test_generation_stops_at_eos_and_pads_after_it(generation_packages):
    package, model = generation_packages["gpt2"]
    ids, mask = prompts()
    free = reference(model, ids, mask, 12, min_new_tokens=12, pad_token_id=0)
    eos = int(free[0, 7 + 3])  # the first prompt's fourth new token
    # the model has no pad token: transformers then pads with the eos token, and so does aotc
    expected = reference(model, ids, mask, 12, eos_token_id=eos, pad_token_id=eos)
    got = aotc_runtime.load(package).generate(ids, mask, max_new_tokens=12, eos_token_ids=[eos])
    assert got.tolist() == expected.tolist()
    first = got[0, 7:].tolist()
    assert first.index(eos) == 3 and set(first[4:]) == {eos}


def test_sampling_is_repeatable_with_a_seed_and_top_k_1_is_greedy(generation_packages):
    package, _model = generation_packages["gpt2"]
    loaded = aotc_runtime.load(package)
    ids, mask = prompts()
    settings = {"max_new_tokens": 12, "temperature": 0.9, "top_k": 50, "top_p": 0.95}
    first = loaded.generate(ids, mask, seed=7, **settings)
    assert loaded.generate(ids, mask, seed=7, **settings).tolist() == first.tolist()
    other = loaded.generate(ids, mask, seed=8, **settings)
    assert other.tolist() != first.tolist()  # the seed is used (equal would be a 1-in-many chance)
    greedy = loaded.generate(ids, mask, max_new_tokens=12)
    top1 = loaded.generate(ids, mask, max_new_tokens=12, temperature=0.9, top_k=1, seed=7)
    assert top1.tolist() == greedy.tolist()


def test_streaming_yields_the_same_tokens_step_by_step(generation_packages):
    package, _model = generation_packages["gpt2"]
    loaded = aotc_runtime.load(package)
    ids, mask = prompts()
    steps = list(loaded.stream(ids, mask, max_new_tokens=6, eos_token_ids=[]))
    assert [list(s.shape) for s in steps] == [[2]] * 6
    whole = loaded.generate(ids, mask, max_new_tokens=6, eos_token_ids=[])
    assert torch.stack(steps, 1).tolist() == whole[:, 7:].tolist()


def test_concurrent_generations_do_not_share_the_cache(generation_packages):
    package, _model = generation_packages["gpt2"]
    loaded = aotc_runtime.load(package)
    ids, mask = prompts()
    expected = {k: loaded.generate(ids[k : k + 1], mask[k : k + 1], max_new_tokens=12)
                for k in (0, 1)}  # fmt: skip
    results: dict = {}

    def run(k: int) -> None:
        for _ in range(3):
            results.setdefault(k, []).append(
                loaded.generate(ids[k : k + 1], mask[k : k + 1], max_new_tokens=12)
            )

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k in (0, 1):
        assert all(r.tolist() == expected[k].tolist() for r in results[k])


@pytest.mark.parametrize(
    "ids, new_tokens, words",
    [
        (torch.zeros(1, 30, dtype=torch.long), 8, "KV cache holds 32"),
        (torch.full((1, 4), 512), 4, "outside the vocabulary"),
        (torch.zeros(1, 0, dtype=torch.long), 4, "empty"),
        (torch.zeros(3, 4, dtype=torch.long), 4, "at most 2 at once"),
        (torch.zeros(1, 4, dtype=torch.long), 0, "at least 1"),
    ],
    ids=["too-long", "out-of-vocab", "empty", "too-many-prompts", "no-new-tokens"],
)
def test_bad_requests_get_one_line_and_exit_code_2(generation_packages, ids, new_tokens, words):
    package, _model = generation_packages["gpt2"]
    with pytest.raises(GenerationInputError) as error:
        aotc_runtime.load(package).generate(ids, max_new_tokens=new_tokens)
    assert words in str(error.value) and "\n" not in str(error.value)
    assert error.value.exit_code == 2


def test_a_one_call_package_refuses_generate(packages):
    loaded = aotc_runtime.load(packages.get("mlp").package)
    with pytest.raises(PackageError, match="not a text-generation package"):
        loaded.generate(torch.zeros(1, 4, dtype=torch.long), max_new_tokens=2)


def test_a_generation_artifact_is_refused_by_tune_and_specialize(generation_packages, tmp_path):
    artifact = Path(generation_packages["gpt2"][0]).parent / "gpt2.pt2"
    result = invoke("build", artifact, "--specialize", "S=4", "-o", tmp_path / "p")
    assert result.exit_code == 2 and "text-generation artifact" in result.stderr, result.stderr


def test_the_generate_command_prints_the_new_ids_and_timings(generation_packages):
    import json

    package, _model = generation_packages["gpt2"]
    ids, mask = prompts()
    first, second = ids[0].tolist(), ids[1, 3:].tolist()
    result = invoke(
        "generate", package, "--prompt-ids", ",".join(map(str, first)),
        "--prompt-ids", ",".join(map(str, second)), "--max-new-tokens", 8, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    expected = aotc_runtime.load(package).generate(ids, mask, max_new_tokens=8)
    assert report["generated_ids"] == expected[:, 7:].tolist()
    assert report["timings"]["decode_steps"] == 7 and report["timings"]["first_token_ms"] > 0


def test_a_generation_of_one_token_reports_no_decode_rate(generation_packages):
    """One new token is the prefill's alone: the timing line says no decode step followed it,
    not a rate of 0 tokens/s over no steps."""
    result = invoke(
        "generate", generation_packages["gpt2"][0], "--prompt-ids", "5,17,42",
        "--max-new-tokens", 1,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "no decode step after it (every sequence ended at its first token)" in result.stderr
    assert "tokens/s" not in result.stderr


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--prompt-ids", "5,999"], 2, "outside the vocabulary"),
        (["--prompt-ids", "5,x"], 2, "comma-separated"),
        (["--prompt-ids", "5", "--max-new-tokens", "40"], 2, "KV cache holds 32"),
    ],
    ids=["out-of-vocab", "not-ids", "too-long"],
)
def test_the_generate_command_refuses_bad_requests_in_one_line(
    generation_packages, args, code, words
):
    result = invoke("generate", generation_packages["gpt2"][0], *args)
    assert result.exit_code == code and words in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_generate_command_refuses_a_one_call_package(packages):
    result = invoke("generate", packages.get("mlp").package, "--prompt-ids", "1,2")
    assert result.exit_code == 7 and "not a text-generation package" in result.stderr


def test_a_tokenizer_travels_with_the_package_and_text_prompts_work(generation_packages):
    import json

    from tokenizers import Tokenizer

    package, _model = generation_packages.with_tokenizer()
    manifest = aotc_runtime.read_manifest(package)
    assert manifest.generation.tokenizer == "tokenizer.json"
    assert "tokenizer.json" in manifest.files  # hashed (and signed) like the model

    result = invoke("generate", package, "--prompt", "w5 w17 w42", "--max-new-tokens", 6, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    by_ids = aotc_runtime.load(package).generate(torch.tensor([[5, 17, 42]]), max_new_tokens=6)
    assert report["generated_ids"] == [by_ids[0, 3:].tolist()]
    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    assert report["generated_text"] == [tokenizer.decode(report["generated_ids"][0])]


def test_text_prompts_without_a_tokenizer_are_refused_in_one_line(generation_packages):
    result = invoke("generate", generation_packages["gpt2"][0], "--prompt", "hello")
    assert result.exit_code == 2 and "carries no tokenizer" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_cache_longer_than_the_models_positions_is_refused_at_export(
    generation_packages, tmp_path
):
    source = (
        Path(generation_packages["gpt2"][0]).parent / "gpt2_lm.py"
    )  # the zoo's GPT-2: 64 positions
    result = invoke(
        "export", source, "--task", "text-generation", "--max-seq-len", 96, "-o", tmp_path / "a.pt2"
    )
    assert result.exit_code == 2 and "use at most 64" in result.stderr, result.stderr


def test_without_batch_size_the_export_takes_8_rows_within_a_gib_of_cache(tmp_path):
    """The rows `aotc serve` runs at once: 8, halved while their KV cache passes 1 GiB."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from aotc.export.text_generation import cache_bytes, default_batch_size

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128)).eval()
    assert cache_bytes(model, 1, 1024) == 2 * 2 * 2 * 1024 * 32 * 4  # layers, k+v, heads, dim
    assert default_batch_size(model, 1024) == 8
    per_row = cache_bytes(model, 1, 1)
    assert default_batch_size(model, (1 << 30) // (4 * per_row)) == 4  # 4 rows are exactly 1 GiB
    assert default_batch_size(model, 1 << 30) == 1  # even one row is over: one row


def test_the_empty_kv_cache_takes_no_room_in_the_package(generation_packages):
    """The cache's initial zeros are one value expanded to the cache's shape in state.pt (GPT-2
    124M's 1,024 positions would be 75 MB of zeros), and the package still starts from zeros."""
    package, _model = generation_packages["gpt2"]
    state = aotc_runtime.read_manifest(package).signature.state
    cache_bytes = sum(
        torch.Size(spec.shape).numel()
        * torch.empty(0, dtype=getattr(torch, spec.dtype)).element_size()
        for spec in state
    )
    assert cache_bytes > 60_000
    assert (Path(package) / "state.pt").stat().st_size < cache_bytes / 10
    loaded = aotc_runtime.load(package)
    assert all(bool((t == 0).all()) and t.is_contiguous() for t in loaded._state)


def test_a_step_writes_the_new_cache_positions_into_the_packages_own_cache(generation_packages):
    """The program updates the KV cache it is given in place (signature.state_in_place), writing
    the positions it feeds and nothing else: no copy of the whole cache per token. After a
    3-token prefill the package holds the same cache tensors, filled at positions 0..2 only; a
    reset empties those same tensors again."""
    from aotc_runtime.generation import prefill_inputs

    package, _model = generation_packages["gpt2"]
    loaded = aotc_runtime.load(package)
    assert loaded.signature.state_in_place
    caches = [t for t, spec in zip(loaded._state, loaded.signature.state) if "_cache_" in spec.name]
    before = [t.data_ptr() for t in loaded._state]
    ids = torch.tensor([[5, 17, 42], [7, 8, 9]])
    generation = loaded.manifest.generation
    logits = loaded(*prefill_inputs(ids, torch.ones_like(ids)))
    assert list(logits.shape) == [2, generation.vocab_size]  # the logits alone come back
    assert [t.data_ptr() for t in loaded._state] == before
    assert caches and all(bool((t[:, :3] != 0).any()) for t in caches)
    assert all(bool((t[:, 3:] == 0).all()) for t in caches)  # [batch, positions, heads, dim]
    loaded.reset_state()
    assert [t.data_ptr() for t in loaded._state] == before
    assert all(bool((t == 0).all()) for t in caches)


def test_a_bf16_package_keeps_its_kv_cache_in_bf16_and_follows_transformers(
    generation_packages, tmp_path
):
    """A bf16 build computes in bf16 and stores its state (the KV cache) in bf16 too: the state
    does not cross the cast at the package's boundary, which would convert the whole cache on
    every decode step and hold it in fp32."""
    package, model = generation_packages["gpt2"]
    artifact = Path(package).parent / "gpt2.pt2"
    bf16 = tmp_path / "gpt2_bf16"
    # the default bf16 check: these sharpened LMs' logits reach 12, transformers in bf16 is 0.12
    # from fp32 at prefill, and the check bounds errors by the logits' scale (aotc/compiler/verify.py)
    done = invoke(
        "build", artifact, "--device", "cpu", "--precision", "bf16", "-o", bf16, "--quiet"
    )
    assert done.exit_code == 0, done.stderr
    floating = {s.dtype for s in aotc_runtime.read_manifest(bf16).signature.state} - {"int64"}
    assert floating == {"bfloat16"}
    loaded = aotc_runtime.load(bf16)
    assert {t.dtype for t in loaded._state if t.is_floating_point()} == {torch.bfloat16}
    ids, mask = prompts()
    model = model.to(torch.bfloat16)
    expected = reference(model, ids, mask, 8, min_new_tokens=8, pad_token_id=0)
    got = loaded.generate(ids, mask, max_new_tokens=8, eos_token_ids=[])
    # two roundings of the same bf16 computation agree token for token until the reference's own
    # top two logits are a near tie, by the build check's bf16 rule (a random LM's top two logits
    # are sometimes close enough for bf16 to swap them; which pair depends on the CPU's kernels)
    atol, rtol = GENERATION["bf16"]
    full = torch.cat([mask, torch.ones(2, 8, dtype=torch.long)], dim=1)
    for row in range(2):
        differ = (got[row] != expected[row]).nonzero()
        if len(differ) == 0:
            continue
        at = int(differ[0])
        with torch.no_grad():
            logits = model(expected[row : row + 1, :at], attention_mask=full[row : row + 1, :at])
        scores = logits.logits[0, -1].float()
        margin = float(scores[expected[row, at]] - scores[got[row, at]])
        assert margin <= atol + rtol * float(scores.std()), (row, at, margin, float(scores.std()))
    assert {t.dtype for t in loaded._state if t.is_floating_point()} == {torch.bfloat16}
