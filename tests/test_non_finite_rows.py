"""A sequence whose logits turn non-finite ends alone, in every front end, and the package goes
on: a tiny Llama whose embedding row POISONED is NaN (untied from its head), as a NaN weight, NaN
quantization scales or an fp16 overflow leave a real checkpoint. Nothing else in the model is
wrong: a prompt without that token generates as before. Built once for the module (the build's
check is told to keep the package: its random prompts may feed the NaN row)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import invoke, save_llama_folder

import aotc_runtime
from aotc_runtime.decode_engine import DecodeEngine
from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.generation_request import GenerationRequest
from aotc_runtime.sampling import GREEDY, Sampling

pytestmark = pytest.mark.slow
POISONED = 500
# the poisoned token last: its own hidden state is NaN, whatever an attention kernel makes of NaN
# keys and values (the CUDA build's attention gives finite outputs for an earlier NaN position)
CLEAN, WITH_NAN = [5, 17, 42, 9, 100], [7, 300, POISONED]


def poisoned_folder(folder: Path) -> Path:
    from safetensors.torch import load_file, save_file

    save_llama_folder(folder)
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = False  # a NaN row of a tied head would poison every row
    (folder / "config.json").write_text(json.dumps(config))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    where = folder / index["weight_map"]["model.embed_tokens.weight"]
    tensors = load_file(str(where))
    embedding = tensors["model.embed_tokens.weight"]
    tensors["model.embed_tokens.weight"] = embedding
    index["weight_map"]["lm_head.weight"] = where.name
    tensors["lm_head.weight"] = embedding.clone()  # the untied head: the same values, no NaN
    embedding[POISONED] = float("nan")
    save_file(tensors, str(where), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def build(tmp: Path, device: str) -> Path:
    folder = poisoned_folder(tmp / "poisoned")
    artifact, package = tmp / "lm.pt2", tmp / f"lm_{device}"
    done = invoke("export", folder, "--task", "text-generation", "--max-seq-len", 32,
                  "--batch-size", 2, "-o", artifact)  # fmt: skip
    assert done.exit_code == 0, done.stderr
    # on the GPU with CUDA graphs: the sampler's marks are written inside the captured decode step
    mode = ["--mode", "reduce-overhead"] if device == "cuda" else []
    done = invoke("build", artifact, "--device", device, *mode, "--allow-mismatch", "--quiet",
                  "-o", package)  # fmt: skip
    assert done.exit_code == 0, done.stderr
    return package


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("non_finite"), "cpu")


def alone(package, prompt: list, new_tokens: int) -> list:
    out = package.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, eos_token_ids=[])
    return out[0, len(prompt) :].tolist()


def request(prompt: list, new_tokens: int, sampling: Sampling = GREEDY) -> GenerationRequest:
    return GenerationRequest(tuple(prompt), new_tokens, sampling, eos_token_ids=())


def non_finite_row_ends_alone(package) -> None:
    """A clean row beside a poisoned one, then a clean row into the freed row: the clean rows get
    their lone tokens, the poisoned one ends with FinishReason.ERROR at its first token."""
    expected = {"a": alone(package, CLEAN, 10), "c": alone(package, [11, 12, 13], 4)}
    engine = DecodeEngine(package)
    engine.join("a", request(CLEAN, 10))
    engine.join("b", request(WITH_NAN, 6, Sampling(temperature=0.7, seed=1)))
    made: dict = {"a": [], "b": [], "c": []}
    finishes: dict = {}
    for _step in range(40):
        if "b" in finishes and not made["c"] and "c" not in finishes and engine.has_free_row:
            engine.join("c", request([11, 12, 13], 4))
        for new in engine.step():
            assert 0 <= new.token < package.generation.vocab_size
            made[new.key].append(new.token)
            if new.finish is not None:
                finishes[new.key] = new.finish
        if not engine.active:
            break
    assert finishes == {"a": FinishReason.LENGTH, "b": FinishReason.ERROR, "c": FinishReason.LENGTH}
    assert len(made["b"]) == 1
    assert made["a"] == expected["a"] and made["c"] == expected["c"]


def test_a_poisoned_row_ends_alone_and_the_same_batch_goes_on(poisoned):
    non_finite_row_ends_alone(aotc_runtime.load(poisoned))


@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.7", "--seed", "1"]],
                         ids=["greedy", "sampled"])  # fmt: skip
def test_aotc_generate_ends_with_exit_3_in_one_line(poisoned, sampling):
    result = invoke("generate", poisoned, "--prompt-ids", ",".join(map(str, WITH_NAN)),
                    "--max-new-tokens", 4, *sampling)  # fmt: skip
    assert result.exit_code == 3, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "logits for prompt 0 were not finite" in lines[0], result.stderr
    clean = invoke("generate", poisoned, "--prompt-ids", "5,17,42", "--max-new-tokens", 4)
    assert clean.exit_code == 0, clean.stderr


@pytest.mark.parametrize("sampling", [[], ["--temperature", 0.7, "--seed", 1]],
                         ids=["greedy", "sampled"])  # fmt: skip
def test_the_cpp_runner_ends_with_exit_3_in_one_line(poisoned, sampling):
    from conftest import built_runner
    from test_cpp_runner import run_cpp

    runner = built_runner()
    done = run_cpp(runner, poisoned, "--generate", "--prompt-ids", "5,17,42,9",
                   "--prompt-ids", ",".join(map(str, WITH_NAN)), "--max-new-tokens", 4,
                   *sampling)  # fmt: skip
    assert done.returncode == 3, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "logits for prompt 1 were not finite" in lines[0], done.stderr
    clean = run_cpp(
        runner, poisoned, "--generate", "--prompt-ids", "5,17,42,9", "--max-new-tokens", 4
    )
    assert clean.returncode == 0, clean.stderr


@pytest.mark.gpu
def test_on_the_gpu_a_poisoned_row_ends_alone_and_the_same_batch_goes_on(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    package = aotc_runtime.load(build(tmp_path, "cuda"))
    assert package.manifest.runtime.cuda_graphs  # the decode steps replay a CUDA graph
    non_finite_row_ends_alone(package)
    with pytest.raises(aotc_runtime.NonFiniteLogitsError):
        package.generate(torch.tensor([WITH_NAN]), max_new_tokens=4, temperature=0.7, seed=1)
    assert len(alone(package, CLEAN, 6)) == 6
