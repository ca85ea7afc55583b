"""Text streaming: `aotc generate --stream` prints text as it comes, `--stream --json` a JSON line
per step, `Package.stream(text=True)` yields each step's text, never half a character; and
`generate` takes prompts as lists of token ids."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import invoke

import aotc_runtime
from aotc_runtime import GenerationInputError
from aotc_runtime.text_delta import TextDelta
from aotc_runtime.text_stream import with_text

MULTI_BYTE = "aé€🙂b"  # 1, 2, 3 and 4 bytes


@pytest.fixture(scope="module")
def byte_tokenizer():
    """A byte-level tokenizer: every byte one token, so a character of n bytes takes n tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def test_a_token_that_ends_mid_character_adds_no_text_until_the_character_is_whole(byte_tokenizer):
    ids = byte_tokenizer.encode(MULTI_BYTE).ids
    assert len(ids) == 11
    delta = TextDelta(byte_tokenizer, ())
    pieces = [delta.add(token, last=i == len(ids) - 1)[0] for i, token in enumerate(ids)]
    assert pieces == ["a", "", "é", "", "", "€", "", "", "", "🙂", "b"]
    assert "".join(pieces) == MULTI_BYTE


def test_text_steps_split_no_character_and_stop_after_the_end_of_sequence(byte_tokenizer):
    """Two prompts' steps (a prompt that ended shows the pad id): each prompt's text is its
    tokens' text, each piece whole characters, and nothing after its end-of-sequence id."""
    first = byte_tokenizer.encode(MULTI_BYTE).ids
    eos = byte_tokenizer.encode("!").ids[0]
    second = byte_tokenizer.encode("€é").ids + [eos]
    second += [eos] * (len(first) - len(second))  # the pad after the end: the eos id
    steps = [torch.tensor([a, b]) for a, b in zip(first, second)]
    got = list(with_text(iter(steps), byte_tokenizer, (eos,), False, len(first)))
    texts = ["".join(step.text[row] for step in got) for row in range(2)]
    assert texts == [MULTI_BYTE, "€é!"]
    assert all("\ufffd" not in piece for step in got for piece in step.text)
    assert [step.ids.tolist() for step in got] == [s.tolist() for s in steps]


@pytest.fixture(scope="module")
def lm(generation_packages):
    package, _model = generation_packages.with_tokenizer()
    return package


def test_stream_with_text_is_generates_tokens_with_their_text(lm):
    loaded = aotc_runtime.load(lm)
    ids = torch.tensor([[5, 17, 42], [9, 8, 7]])
    steps = list(loaded.stream(ids, max_new_tokens=8, eos_token_ids=[], text=True))
    whole = loaded.generate(ids, max_new_tokens=8, eos_token_ids=[])[:, 3:]
    assert torch.equal(torch.stack([step.ids for step in steps], 1), whole)
    for row in range(2):
        streamed = "".join(step.text[row] for step in steps)
        assert streamed == loaded.tokenizer.decode(whole[row].tolist())
        # word-level: each step adds its word (the first without the space before it)
        assert [s.text[row].strip() for s in steps] == [f"w{t}" for t in whole[row].tolist()]


def test_generate_stream_prints_the_text_as_it_comes(lm):
    done = invoke("generate", lm, "--prompt", "w5 w17 w42", "--max-new-tokens", 8, "--stream")
    assert done.exit_code == 0, done.stderr
    plain = invoke("generate", lm, "--prompt", "w5 w17 w42", "--max-new-tokens", 8)
    assert done.stdout == plain.stdout  # the same text, one line, made as it came
    assert done.stdout.startswith("w") and done.stdout.count("\n") == 1


def test_generate_stream_json_prints_a_line_per_step_then_the_report(lm):
    args = ("generate", lm, "--prompt", "w5 w17 w42", "--prompt", "w9", "--max-new-tokens", 6)
    done = invoke(*args, "--stream", "--json")
    assert done.exit_code == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    report = json.loads(invoke(*args, "--json").stdout)
    *steps, last = lines
    assert last["generated_ids"] == report["generated_ids"]
    assert last["generated_text"] == report["generated_text"]
    assert [s["step"] for s in steps] == list(range(len(steps))) and len(steps) == 6
    for row in range(2):
        assert [s["token_ids"][row] for s in steps] == report["generated_ids"][row]
        assert "".join(s["text"][row] for s in steps) == report["generated_text"][row]


def test_generate_stream_of_several_text_prompts_without_json_is_refused(lm):
    done = invoke("generate", lm, "--prompt", "w5", "--prompt", "w9", "--stream")
    assert done.exit_code == 2
    assert "--stream prints one prompt's text as it comes, and 2 prompts were given" in done.stderr
    assert "add --json" in done.stderr and "Traceback" not in done.stderr


def test_generate_takes_lists_of_token_ids(lm):
    loaded = aotc_runtime.load(lm)
    by_tensor = loaded.generate(torch.tensor([[5, 17, 42]]), max_new_tokens=6)
    assert torch.equal(loaded.generate([[5, 17, 42]], max_new_tokens=6), by_tensor)
    assert torch.equal(loaded.generate([5, 17, 42], max_new_tokens=6), by_tensor)
    # prompts of different lengths: left-padded with a mask, as transformers pads a batch
    ids = torch.tensor([[5, 17, 42], [0, 9, 8]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    expected = loaded.generate(ids, mask, max_new_tokens=6)
    assert torch.equal(loaded.generate([[5, 17, 42], [9, 8]], max_new_tokens=6), expected)
    steps = list(loaded.stream([[5, 17, 42], [9, 8]], max_new_tokens=6))
    assert torch.equal(torch.stack(steps, 1), expected[:, 3:])


@pytest.mark.parametrize(
    "prompts, problem",
    [
        ([[5, 17], []], "each prompt at least one token"),
        ([[5, "a"]], "token id 'a' is not a token id"),
        ([[5, -1]], "token id -1 is not a token id"),
    ],
)
def test_bad_lists_of_token_ids_are_refused_in_one_line(lm, prompts, problem):
    loaded = aotc_runtime.load(lm)
    with pytest.raises(GenerationInputError, match=problem):
        loaded.generate(prompts, max_new_tokens=2)
