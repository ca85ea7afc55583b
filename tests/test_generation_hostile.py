"""Text generation probed as an attacker and a careless caller would: no index from a caller or a
package reaches the compiled model unchecked (its own bounds check ends the process), the
generation record is held against the compiled model, sampling values outside the accepted
ranges are the caller's error, and an open generation owns the package's KV cache.

Tiny GPT-2 packages from conftest's `generation_packages` (batch 2, a 32-token cache, vocab 512).
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import torch
from conftest import error_lines, invoke, tampered_copy, tiny_tokenizer

import aotc_runtime
from aotc_runtime import generation_gate
from aotc_runtime.errors import GenerationBusyError, GenerationInputError, PackageError

pytestmark = pytest.mark.slow

IDS = torch.tensor([[5, 17, 42]])


@pytest.fixture(scope="module")
def gpt2(generation_packages):
    return generation_packages["gpt2"][0]


@pytest.fixture(scope="module")
def loaded(gpt2):
    return aotc_runtime.load(gpt2)


def refused(result, code: int, words: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and words in lines[0], result.stderr


def generation(field: str, value):
    return lambda manifest: manifest["generation"].__setitem__(field, value)


@pytest.mark.parametrize("mask", [[-5, 1, 1], [1000, 1, 1], [2, 1, 1], [0.5, 1, 1]])
def test_a_mask_that_is_not_0_or_1_is_the_callers_error(loaded, mask):
    with pytest.raises(
        GenerationInputError, match="attention_mask holds values other than 0 and 1"
    ):
        loaded.generate(IDS, torch.tensor([mask]), max_new_tokens=4)
    assert GenerationInputError.exit_code == 2


def test_an_eos_id_outside_the_vocabulary_never_becomes_the_pad(loaded):
    # the model has no pad token: the first eos id would be fed back once a row ends
    prompts = torch.tensor([[5, 17], [6, 7]])
    with pytest.raises(
        GenerationInputError, match=r"end-of-sequence id 600 is outside the vocabulary \(0\.\.511\)"
    ):
        loaded.generate(prompts, max_new_tokens=6, eos_token_ids=[600, 379])


def test_token_ids_as_a_list_are_read_as_the_tensor(loaded):
    as_tensor = loaded.generate(torch.tensor([[5, 17, 42]]), max_new_tokens=2)
    assert loaded.generate([[5, 17, 42]], max_new_tokens=2).tolist() == as_tensor.tolist()


@pytest.mark.parametrize(
    "sampling, words",
    [
        ({"temperature": 1e-39}, "temperature 1e-39 is outside the accepted values"),
        ({"temperature": float("nan")}, "temperature nan is outside the accepted values"),
        ({"temperature": 1.0, "top_p": 1e-46}, "top-p 1e-46 is outside [1e-06, 1]"),
        ({"temperature": 1.0, "seed": 2**64}, "seed 18446744073709551616 is not a whole number"),
        ({"temperature": 1.0, "seed": -1}, "seed -1 is not a whole number"),
        ({"temperature": 1.0, "top_k": 2.7}, "top-k 2.7 is not a whole number"),
        ({"max_new_tokens": 1.9}, "max_new_tokens is 1.9"),
    ],
)
def test_sampling_values_outside_the_accepted_ranges_are_the_callers_error(loaded, sampling, words):
    settings = {"max_new_tokens": 4, **sampling}
    with pytest.raises(GenerationInputError) as refused_call:
        loaded.generate(IDS, **settings)
    assert words in str(refused_call.value)


RECORD_LIES = [
    ("vocab_size", 100000, "vocab_size is 100000 but the model's is 512"),
    ("pad_token_id", 100000, "pad_token_id holds 100000, outside the vocabulary (0..511)"),
    ("eos_token_ids", [3, 100000], "eos_token_ids holds 100000, outside the vocabulary"),
    ("max_seq_len", 2**31 - 1, "max_seq_len is 2147483647 but the model's is 32"),
    ("batch_size", 2**31 - 1, "batch_size is 2147483647 but the model's is 2"),
    ("max_seq_len", 16, "max_seq_len is 16 but the model's is 32"),
    ("vocab_size", 256, "vocab_size is 256 but the model's is 512"),
    (
        "tokenizer",
        "manifest.json",
        "its tokenizer manifest.json is not one of the package's hashed",
    ),
]


@pytest.mark.parametrize("field, value, words", RECORD_LIES, ids=lambda v: str(v)[:20])
def test_a_record_that_disagrees_with_the_model_is_refused_at_load_and_by_verify(
    gpt2, tmp_path, field, value, words
):
    package = tampered_copy(gpt2, tmp_path / "lying", generation(field, value))
    with pytest.raises(
        PackageError, match="its generation record does not match its compiled model"
    ) as error:
        aotc_runtime.load(package)
    assert words in str(error.value) and "rebuild it with `aotc build --force`" in str(error.value)
    refused(invoke("generate", package, "--prompt-ids", "5,17,600"), 7, words)
    verified = invoke("verify", package, "--json")
    assert verified.exit_code == 7, verified.stderr
    checks = {c["name"]: c["status"] for c in json.loads(verified.stdout)["checks"]}
    assert checks["manifest"] == "failed"


def test_cli_values_that_overflow_are_usage_errors(gpt2):
    refused(
        invoke("generate", gpt2, "--prompt-ids", "99999999999999999999"),
        2,
        "token id 99999999999999999999 is not a token id",
    )
    result = invoke("generate", gpt2, "--prompt-ids", "5", "--temperature", "1", "--seed", 2**64)
    assert result.exit_code == 2 and "0<=x<=18446744073709551615" in result.stderr
    result = invoke("generate", gpt2, "--prompt-ids", "5", "--temperature", "1", "--seed", -1)
    assert result.exit_code == 2 and "0<=x<=18446744073709551615" in result.stderr
    refused(
        invoke(
            "generate", gpt2, "--prompt-ids", "5", "--max-new-tokens", 4, "--temperature", "1e-39"
        ),
        2,
        "temperature 1e-39 is outside the accepted values: 0 for greedy, or 0.01 to 100",
    )
    refused(
        invoke("generate", gpt2, "--prompt-ids", "5", "--max-new-tokens", 4, "--temperature", "1", "--top-p", "1e-46"),
        2,
        "top-p 1e-46 is outside [1e-06, 1]",
    )  # fmt: skip


def test_a_prompt_that_is_not_utf8_is_a_usage_error(generation_packages):
    package, _model = generation_packages.with_tokenizer()
    # bytes that are not UTF-8 reach Python's argv as lone surrogates
    refused(invoke("generate", package, "--prompt", "w5 \udcff"), 2, "is not valid UTF-8 text")


def test_a_stream_left_open_fails_fast_and_others_respect_it(gpt2, monkeypatch):
    package = aotc_runtime.load(gpt2)
    expected = package.generate(IDS, max_new_tokens=6)
    stream = package.stream(IDS, max_new_tokens=6)
    first = next(stream)
    same_thread = "cannot run while a stream of this package is open in the same thread"
    with pytest.raises(GenerationBusyError, match=same_thread):
        package.generate(IDS, max_new_tokens=2)
    with pytest.raises(GenerationBusyError, match=same_thread):
        package.reset_state()
    monkeypatch.setattr(generation_gate, "PAUSE_GRACE_S", 0.3)
    errors = []
    other = threading.Thread(target=lambda: _record(errors, package))
    other.start()
    other.join(timeout=30)
    assert not other.is_alive(), "a generate waited forever for a stream nobody reads"
    assert len(errors) == 1 and "that nobody has read for 0.3 s" in str(errors[0])
    rest = list(stream)  # the open stream's tokens were never touched
    assert torch.stack([first, *rest], 1).tolist() == expected[:, 3:].tolist()
    assert package.generate(IDS, max_new_tokens=6).tolist() == expected.tolist()


def _record(errors: list, package) -> None:
    try:
        package.generate(IDS, max_new_tokens=2)
    except GenerationBusyError as exc:
        errors.append(exc)


def test_a_plain_call_during_a_paused_stream_is_refused(gpt2):
    package = aotc_runtime.load(gpt2)
    stream = package.stream(IDS, max_new_tokens=4)
    next(stream)
    from aotc_runtime.generation import prefill_inputs

    inputs = prefill_inputs(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long))
    with pytest.raises(
        GenerationBusyError, match="a call of the package cannot run while a stream"
    ):
        package(*inputs)
    stream.close()
    package(*inputs)  # once the stream is closed the package is the caller's again


def _rewrite_state(change):
    def files(folder: Path) -> None:
        state = torch.load(folder / "state.pt", weights_only=True)
        torch.save([change(t) for t in state], folder / "state.pt")

    return files


def _transposed(t):
    if t.dim() < 2:
        return t
    return torch.zeros(t.shape[::-1], dtype=t.dtype).permute(*reversed(range(t.dim())))


def test_state_in_another_layout_is_refused_at_load(gpt2, tmp_path):
    package = tampered_copy(gpt2, tmp_path / "transposed", files=_rewrite_state(_transposed))
    with pytest.raises(PackageError, match="in a layout the model does not read"):
        aotc_runtime.load(package)
    sparse = tampered_copy(
        gpt2,
        tmp_path / "sparse",
        files=_rewrite_state(lambda t: t.to_sparse() if t.dim() >= 2 else t),
    )
    refused(invoke("generate", sparse, "--prompt-ids", "5,6", "--max-new-tokens", 2), 7, "state.pt")


def test_verify_compares_the_state_with_the_artifacts(gpt2, tmp_path):
    nan = _rewrite_state(lambda t: torch.full_like(t, float("nan")) if t.is_floating_point() else t)
    refused(invoke("generate", tampered_copy(gpt2, tmp_path / "nan", files=nan), "--prompt-ids", "5"),
            7, "holds key_cache_0 with NaN values")  # fmt: skip
    # finite values that are not the artifact's: only a comparison with it can tell
    ones = _rewrite_state(lambda t: torch.ones_like(t) if t.is_floating_point() else t)
    package = tampered_copy(gpt2, tmp_path / "ones", files=ones)
    result = invoke("verify", package, "--json")
    assert result.exit_code == 7, result.stdout + result.stderr
    state = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "state")
    assert state["status"] == "failed" and "other values than" in state["detail"]
    clean = invoke("verify", gpt2, "--json")
    assert clean.exit_code == 0, clean.stdout + clean.stderr


def test_a_tokenizer_file_that_is_not_a_tokenizer_is_a_package_error(generation_packages, tmp_path):
    source, _model = generation_packages.with_tokenizer()
    package = tampered_copy(
        source,
        tmp_path / "garbage",
        files=lambda folder: (folder / "tokenizer.json").write_text("{not a tokenizer"),
    )
    refused(
        invoke("generate", package, "--prompt", "w5 w6"),
        7,
        "is not one the `tokenizers` library reads",
    )
    missing = tampered_copy(source, tmp_path / "missing", generation("tokenizer", "other.json"))
    refused(
        invoke("generate", missing, "--prompt", "w5 w6"),
        7,
        "its tokenizer other.json is not one of",
    )


def test_export_refuses_a_tokenizer_that_does_not_name_the_models_tokens(
    generation_packages, tmp_path
):
    from tokenizers import Tokenizer, models

    small = tmp_path / "small"
    small.mkdir()
    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(
        str(small / "tokenizer.json")
    )
    source = generation_packages.model_file("gpt2")
    result = invoke("export", source, "--task", "text-generation", "--max-seq-len", 32,
                    "--tokenizer", small, "-o", tmp_path / "lm.pt2")  # fmt: skip
    refused(result, 2, "knows 2 tokens, but the model has 512")
    assert not (tmp_path / "lm.pt2").exists()


def test_export_refuses_a_kv_cache_larger_than_the_machine(generation_packages, tmp_path):
    source = generation_packages.model_file("gpt2")
    result = invoke("export", source, "--task", "text-generation", "--max-seq-len", 32,
                    "--batch-size", 100000000, "-o", tmp_path / "lm.pt2")  # fmt: skip
    refused(result, 2, "--batch-size 100000000 with --max-seq-len 32 needs a KV cache of")


def test_generate_can_require_a_signature(generation_packages, tmp_path, keys):
    source, _model = generation_packages.with_tokenizer()
    package = tmp_path / "signed"
    shutil.copytree(source, package)
    assert invoke("sign", package, "--key", keys.mine.private).exit_code == 0
    key = ["--require-signature", "--public-key", keys.mine.public]
    args = ["--prompt", "w5 w6", "--max-new-tokens", 3, *key]
    result = invoke("generate", package, *args)
    assert result.exit_code == 0, result.stderr
    refused(invoke("generate", source, *args), 7, "is not signed")
    tiny_tokenizer(tmp_path / "swap")  # another tokenizer of the same words, written anew
    swapped = json.loads((tmp_path / "swap" / "tokenizer.json").read_text())
    swapped["model"]["vocab"]["w5"], swapped["model"]["vocab"]["w6"] = 6, 5
    (package / "tokenizer.json").write_text(json.dumps(swapped))
    refused(invoke("generate", package, *args), 7, "tokenizer.json")
    usage = invoke("generate", package, "--prompt", "w5", "--require-signature")
    assert usage.exit_code == 2 and "needs --public-key" in usage.stderr


def test_an_onnx_runtime_package_keeps_its_tokenizer(generation_packages, tmp_path):
    pytest.importorskip("onnxruntime")
    source, _model = generation_packages.with_tokenizer()
    artifact = generation_packages.root / "gpt2_tok.pt2"
    package = tmp_path / "ort_pkg"
    built = invoke("build", artifact, "--backend", "onnxruntime", "--quiet", "-o", package)
    assert built.exit_code == 0, built.stderr
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["generation"]["tokenizer"] in manifest["files"]
    args = ["--prompt", "w5 w6 w7", "--max-new-tokens", 4, "--json"]
    ours = invoke("generate", package, *args)
    assert ours.exit_code == 0, ours.stderr
    inductor = invoke("generate", source, *args)
    assert json.loads(ours.stdout)["generated_ids"] == json.loads(inductor.stdout)["generated_ids"]


def test_serve_refuses_a_lying_record_before_ray_starts(gpt2, tmp_path):
    """Served, a pad id outside the vocabulary killed the replica at the first request (through the
    hidden filler row) and the client got a plain-text 500."""
    package = tampered_copy(gpt2, tmp_path / "lying", generation("pad_token_id", 100000))
    result = invoke("serve", package, "--check")
    assert result.exit_code == 7, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "pad_token_id holds 100000, outside the vocabulary" in errors[0]
    assert "Traceback" not in result.stderr


SMALL_GPT2 = """
from transformers import GPT2Config, GPT2LMHeadModel


def get_model():  # a small config that keeps GPT-2's end-of-sequence id, 50256
    return GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=1,
                                      n_head=2)).eval()
"""


def test_config_ids_outside_the_vocabulary_are_left_out_at_export(tmp_path):
    """A model written as people write a small one keeps its family's eos id, outside its own
    vocabulary: transformers only warns; the export leaves the id out of the record (the runtimes
    refuse a record holding it) and says so, and the package generates transformers' tokens."""
    from conftest import load_model_file

    source = tmp_path / "small_gpt2.py"
    source.write_text(SMALL_GPT2)
    artifact, package = tmp_path / "lm.pt2", tmp_path / "lm_pkg"
    exported = invoke("export", source, "--task", "text-generation", "--max-seq-len", 32,
                      "--batch-size", 2, "-o", artifact)  # fmt: skip
    assert exported.exit_code == 0, exported.stderr
    assert "token id(s) 50256 as end-of-sequence or pad, outside its vocabulary (0..299)" in (
        exported.stderr
    )
    built = invoke("build", artifact, "--device", "cpu", "--quiet", "-o", package)
    assert built.exit_code == 0, built.stderr
    record = json.loads((package / "manifest.json").read_text())["generation"]
    assert record["eos_token_ids"] == [] and record["pad_token_id"] is None
    ids = torch.tensor([[5, 17, 42], [0, 9, 8]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    with torch.no_grad():
        expected = load_model_file(source).generate(
            ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False,
            pad_token_id=0,
        )  # fmt: skip
    assert aotc_runtime.load(package).generate(ids, mask, max_new_tokens=6).tolist() == (
        expected.tolist()
    )
