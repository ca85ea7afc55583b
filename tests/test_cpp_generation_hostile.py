"""The C++ runner's generation surface against hostile or careless input: a package whose
`generation` record lies about its compiled model, sampling values outside the accepted ranges,
flags that are not whole numbers or belong to another kind of run, and a doctored state.pt.

Each refusal is one line on stderr with its exit code (2: the command line, 7: the package); none
reaches a kernel (an out-of-range index there aborts the process: exit 134) or an allocation sized
by a lie. The ranges are aotc_runtime/sampling.py's (docs/reliability.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tampered_copy
from test_cpp_runner import run_cpp

import aotc_runtime
from aotc_runtime.errors import AotcRuntimeError

FIX = "; rebuild it with `aotc build --force`"


@pytest.fixture(scope="module")
def lm(generation_packages) -> Path:
    """GPT-2 (zoo, scaled): vocabulary 512, batch 2, a cache of 32 positions, eos 511."""
    return generation_packages["gpt2"][0]


def assert_refused(done, code: int, words: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    assert words in lines[0], lines[0]


def python_refusal(package: Path) -> str:
    """The Python runtime's refusal of the same package, as its error line says it."""
    with pytest.raises(AotcRuntimeError) as refused:
        aotc_runtime.load(package)
    return str(refused.value)


GREEDY = ["--generate", "--prompt-ids", "5,17", "--max-new-tokens", "4"]
SAMPLED = ["--generate", "--prompt-ids", "5,17", "--max-new-tokens", "29", "--temperature", "1"]


@pytest.mark.parametrize(
    "field, value, args, detail",
    [
        # today: the embedding's bounds check aborts the process (exit 134)
        ("vocab_size", 100000, ["--generate", "--prompt-ids", "5,17,600"],
         "vocab_size is 100000 but the model's is 512"),
        ("vocab_size", 256, GREEDY, "vocab_size is 256 but the model's is 512"),
        # today: the pad token can reach the embedding through a one-prompt run's hidden filler row
        ("pad_token_id", 100000, SAMPLED, "pad_token_id holds 100000, outside the vocabulary (0..511)"),
        ("eos_token_ids", [511, -3], GREEDY, "eos_token_ids holds -3, outside the vocabulary (0..511)"),
        # today: a mask or batch of 2**31-1 rows allocated (exit 1, can't allocate memory)
        ("max_seq_len", 2**31 - 1, GREEDY, "max_seq_len is 2147483647 but the model's is 32"),
        ("batch_size", 2**31 - 1, GREEDY, "batch_size is 2147483647 but the model's is 2"),
        # today: exit 8, advising to re-export with --dim
        ("max_seq_len", 16, GREEDY, "max_seq_len is 16 but the model's is 32"),
        ("batch_size", 1, ["--generate", "--prompt-ids", "5"], "batch_size is 1 but the model's is 2"),
        ("sliding_window", -1, GREEDY, "sliding_window is -1, below 0"),
        ("tokenizer", "tokenizer.json", GREEDY,
         "its tokenizer tokenizer.json is not one of the package's hashed files"),
        # refused at load, whatever the run: a plain call on random inputs too
        ("vocab_size", 100000, [], "vocab_size is 100000 but the model's is 512"),
    ],
)  # fmt: skip
def test_a_generation_record_that_lies_is_refused_at_load(
    runner, lm, tmp_path, field, value, args, detail
):
    package = tampered_copy(
        lm, tmp_path / "lying", lambda m: m["generation"].update({field: value})
    )
    done = run_cpp(runner, package, *args)
    message = f"package {package}: its generation record does not match its compiled model: "
    assert_refused(done, 7, message + detail + FIX)
    assert done.stderr.strip() == f"error: {python_refusal(package)}"  # the same line in Python


@pytest.mark.parametrize(
    "batch, said",
    [(3, "the step's picks R run 1..4, not 1..3 (its batch_size)"),
     (8, "the step's picks R run 1..4, not 1..8 (its batch_size)")],
    ids=["fewer", "more"],
)  # fmt: skip
def test_a_step_whose_picks_do_not_run_1_to_the_batch_is_refused_at_load(
    runner, generation_packages, tmp_path, batch, said
):
    """A step that gives the logits of R picked tokens, R from 1 to 4: the engine feeds it any R
    from 1 to the record's batch, so a record whose batch_size is another is refused before a
    step is fed picks the program cannot take."""
    four_rows = generation_packages.four_rows("llama")[0]
    package = tampered_copy(
        four_rows, tmp_path / "rows", lambda m: m["generation"].update(batch_size=batch)
    )
    done = run_cpp(runner, package, *GREEDY)
    message = f"package {package}: its generation record does not match its compiled model: "
    assert_refused(done, 7, message + said + FIX)
    assert done.stderr.strip() == f"error: {python_refusal(package)}"  # the same line in Python


@pytest.mark.parametrize(
    "flag, value, accepted",
    [
        # today: NaN probabilities (exit 1) or a nucleus of nothing
        ("--temperature", "1e-39", "0 (greedy) or a number from 0.01 to 100"),
        ("--temperature", "101", "0 (greedy) or a number from 0.01 to 100"),
        ("--temperature", "nan", "0 (greedy) or a number from 0.01 to 100"),
        ("--temperature", "-1", "0 (greedy) or a number from 0.01 to 100"),
        ("--top-p", "1e-46", "a number from 1e-06 to 1"),
        ("--top-p", "0", "a number from 1e-06 to 1"),
        ("--top-p", "1.5", "a number from 1e-06 to 1"),
        ("--top-p", "inf", "a number from 1e-06 to 1"),
        # today: run as 2, as 1
        ("--top-k", "2.7", "a whole number from 1 to 2147483647"),
        ("--top-k", "0", "a whole number from 1 to 2147483647"),
        ("--top-k", "2147483648", "a whole number from 1 to 2147483647"),
        ("--max-new-tokens", "1.9", "a whole number from 1 to 1000000000"),
        ("--max-new-tokens", "0", "a whole number from 1 to 1000000000"),
        ("--seed", "-1", "a whole number from 0 to 2**64-1 (18446744073709551615)"),
        ("--seed", "18446744073709551616", "a whole number from 0 to 2**64-1 (18446744073709551615)"),
        ("--seed", "1e3", "a whole number from 0 to 2**64-1 (18446744073709551615)"),
    ],
)  # fmt: skip
def test_sampling_values_outside_the_accepted_ranges_are_refused(runner, lm, flag, value, accepted):
    done = run_cpp(runner, lm, "--generate", "--prompt-ids", "5,17", flag, value)
    assert_refused(done, 2, f"error: {flag} must be {accepted}, got '{value}'")


def test_the_edges_of_the_accepted_ranges_run(runner, lm):
    """Seed 2**64-1 (today refused past 2**63-1), temperature 0.01 and top-p 1e-6: a nucleus of
    one token, the likeliest, so the sampled tokens are the greedy ones."""
    greedy = run_cpp(runner, lm, *GREEDY, "--json")
    assert greedy.returncode == 0, greedy.stderr
    edges = ["--temperature", "0.01", "--top-p", "1e-6", "--top-k", "2147483647"]
    sampled = run_cpp(runner, lm, *GREEDY, "--json", *edges, "--seed", str(2**64 - 1))
    assert sampled.returncode == 0, sampled.stderr
    expected = json.loads(greedy.stdout)["generated_ids"]
    assert json.loads(sampled.stdout)["generated_ids"] == expected


@pytest.mark.parametrize(
    "args, words",
    [
        # today: silently ignored
        (["--input", "missing.npy"], "--input does not go with --generate"),
        (["--output", "out.npz"], "--output does not go with --generate"),
        (["--iters", "3"], "--iters does not go with --generate"),
        (["--warmup", "1"], "--warmup does not go with --generate"),
        (["--serve"], "--serve does not go with --generate"),
    ],
)
def test_run_flags_do_not_go_with_generate(runner, lm, args, words):
    done = run_cpp(runner, lm, "--generate", "--prompt-ids", "5,17", *args)
    assert_refused(done, 2, words + " (a generation reads --prompt-ids and prints tokens)")


@pytest.mark.parametrize(
    "args",
    [
        ["--top-k", "3"],
        ["--temperature", "0.5"],
        ["--top-p", "0.5"],
        ["--max-new-tokens", "3"],
        ["--stream"],
        ["--prompt-ids", "5"],
    ],
)
def test_generation_flags_need_generate(runner, lm, args):
    done = run_cpp(runner, lm, *args)
    assert_refused(done, 2, f"error: {args[0]} goes with --generate (a text-generation package)")


def with_state(lm: Path, folder: Path, index: int, tensor) -> Path:
    """A copy of the package whose state.pt holds `tensor` at `index`, its hash updated."""

    def replace(copy: Path) -> None:
        state = torch.load(copy / "state.pt", weights_only=True)
        state[index] = tensor
        torch.save(state, copy / "state.pt")

    return tampered_copy(lm, folder, files=replace)


@pytest.mark.parametrize(
    "tensor, words",
    [
        # today: run on, the program reading the transposed cache as if it were contiguous
        (
            lambda: torch.randn(2, 33, 16, 4).transpose(2, 3),
            "holds key_cache_0 in a layout the model does not read (not a dense contiguous tensor)",
        ),
        # today: run on, the NaN in every attention over the cache (an inf may be a state's
        # start, a running maximum's -inf say; a NaN is no value at all)
        (
            lambda: torch.full((1,), float("nan")).expand(2, 33, 4, 16),
            "holds key_cache_0 with NaN values",
        ),
        (
            lambda: torch.zeros(2, 33, 4, 16).index_fill_(0, torch.tensor([1]), float("nan")),
            "holds key_cache_0 with NaN values",
        ),
        # refused today too (TorchScript's unpickler reads no sparse tensor)
        (lambda: torch.zeros(2, 33, 4, 16).to_sparse(), "could not be read"),
    ],
)  # fmt: skip
def test_a_doctored_state_file_is_refused_at_load(runner, lm, tmp_path, tensor, words):
    state = aotc_runtime.read_manifest(lm).signature.state
    # [batch, max_len + 1 (the padding's slot), kv heads, head dim]
    assert state[0].name == "key_cache_0" and list(state[0].shape) == [2, 33, 4, 16]
    package = with_state(lm, tmp_path / "doctored", 0, tensor())
    done = run_cpp(runner, package, *GREEDY)
    assert_refused(done, 7, f"package {package}: its state.pt {words}{FIX}")
    if "could not be read" not in words:  # the Python runtime gives the same line
        assert done.stderr.strip() == f"error: {python_refusal(package)}"


@pytest.mark.parametrize(
    "step_format, made",
    [
        (None, "an aotc from before the generation step had its own KV cache"),
        (
            3,
            "generation step format 3, from an aotc before the step packed its tokens "
            "(this runtime runs format 4)",
        ),
        (5, "generation step format 5, which this runtime does not know (it runs format 4)"),
    ],
)
def test_a_generation_step_format_the_runtimes_do_not_know_is_refused_in_one_line(
    runner, lm, tmp_path, step_format, made
):
    """A package from before aotc owned the cache fed a mask over a shared timeline, one of
    formats 2 and 3 padded windows, one from a newer aotc something else: either runtime would
    feed it the wrong inputs. Both refuse it at load with the same line."""

    def edit(manifest: dict) -> None:
        if step_format is None:
            del manifest["generation"]["step_format"]
        else:
            manifest["generation"]["step_format"] = step_format

    package = tampered_copy(lm, tmp_path / "format", edit)
    done = run_cpp(runner, package, *GREEDY)
    line = f"package {package} was built with {made}; export and build it again with this aotc"
    assert_refused(done, 7, line)
    assert done.stderr.strip() == f"error: {python_refusal(package)}"
