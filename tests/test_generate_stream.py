"""Text streaming: `aotc generate --stream` prints text as it comes, `--stream --json` a JSON line
per step, `Package.stream(text=True)` yields each step's text, never half a character, and where
each prompt ended, both as the decode engine made them (its Made events: the same ends as
`generate`'s, a stop string's included); and `generate` takes prompts as lists of token ids."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import invoke
from fake_generation import LEAD, FakeGeneration

import aotc_runtime
from aotc_runtime import GenerationInputError
from aotc_runtime.finish_reason import FinishReason
from aotc_runtime.generation import TextStep, stream, with_prompts
from aotc_runtime.text_delta import TextDelta

MULTI_BYTE = "aé€🙂b"  # 1, 2, 3 and 4 bytes
STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH


@pytest.fixture(scope="module")
def byte_tokenizer():
    """A byte-level tokenizer: every byte one token, so a character of n bytes takes n tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class Scripted(FakeGeneration):
    """A fake package (tests/fake_generation.py: no compile) whose prompt [i] is followed by the
    tokens scripts[i], in order: a byte-level tokenizer's text, where it ends decided by the
    engine alone."""

    def __init__(self, scripts: list[list[int]], eos_token_ids: tuple = ()):
        super().__init__(batch_size=len(scripts), vocab_size=256, eos_token_ids=eos_token_ids)
        self.scripts = scripts

    def logits(self, history: list[int]) -> list[float]:
        logits = [0.0] * 256
        logits[self.scripts[history[0]][len(history) - 1]] = LEAD
        return logits


def streamed(package: Scripted, tokenizer, **options) -> tuple[list[TextStep], torch.Tensor]:
    """(`stream(..., text=True)`'s steps, `generate`'s new tokens [prompts, new]) of a prompt [i]
    per script, with the same options."""
    prompts = torch.arange(len(package.scripts)).unsqueeze(1)
    steps = list(stream(package, prompts, tokenizer=tokenizer, text=True, **options))
    whole = with_prompts(prompts, stream(package, prompts, tokenizer=tokenizer, **options))
    return steps, whole[:, 1:]


def texts_of(steps: list[TextStep]) -> list[str]:
    return ["".join(step.text[row] for step in steps) for row in range(len(steps[0].text))]


def test_a_token_that_ends_mid_character_adds_no_text_until_the_character_is_whole(byte_tokenizer):
    ids = byte_tokenizer.encode(MULTI_BYTE).ids
    assert len(ids) == 11
    delta = TextDelta(byte_tokenizer, ())
    pieces = [delta.add(token, last=i == len(ids) - 1)[0] for i, token in enumerate(ids)]
    assert pieces == ["a", "", "é", "", "", "€", "", "", "", "🙂", "b"]
    assert "".join(pieces) == MULTI_BYTE


@pytest.mark.parametrize("ignore_eos", [False, True], ids=["eos", "ignore-eos"])
def test_text_steps_split_no_character_and_end_where_the_engine_ends_each_prompt(
    byte_tokenizer, ignore_eos
):
    """Two prompts: the first runs to max_new_tokens (LENGTH), the second to its end-of-sequence
    id (STOP; with ignore_eos, past it to LENGTH). Each prompt's text is its tokens' text, each
    piece whole characters; a prompt that ended shows the pad id (the eos id) and no text; the
    finishes are the engine's, and the ids `generate`'s."""
    first = byte_tokenizer.encode(MULTI_BYTE).ids
    eos = byte_tokenizer.encode("!").ids[0]
    short = byte_tokenizer.encode("€é").ids + [eos]
    second = short + byte_tokenizer.encode("more.").ids  # what it says past its end
    package = Scripted([first, second])
    new = len(first)
    assert len(second) == new
    steps, whole = streamed(
        package, byte_tokenizer, max_new_tokens=new, eos_token_ids=[eos], ignore_eos=ignore_eos
    )
    assert len(steps) == new and all(type(step) is TextStep for step in steps)
    assert all("\ufffd" not in piece for step in steps for piece in step.text)
    assert torch.equal(torch.stack([step.ids for step in steps], 1), whole)
    assert whole[0].tolist() == first
    last = [[None, None]] * (new - 1) + [[LENGTH, LENGTH if ignore_eos else None]]
    if ignore_eos:
        assert texts_of(steps) == [MULTI_BYTE, "€é!more."]
        assert whole[1].tolist() == second
    else:
        assert texts_of(steps) == [MULTI_BYTE, "€é!"]
        ended = len(short)
        assert whole[1].tolist() == short + [eos] * (new - ended)
        assert [step.text[1] for step in steps[ended:]] == [""] * (new - ended)
        last[ended - 1] = [None, STOP]
    assert [step.finish for step in steps] == last


def test_a_stop_string_ends_a_text_stream_where_it_ends_generate(byte_tokenizer):
    """A stop string ends a prompt at the token whose text completes it, the text before it kept
    (held back while it could still begin one: "; t" spans three tokens): the engine's rule, as
    in `aotc serve`, where the text steps once worked out the end again from eos ids and
    max_new_tokens and went on. `generate` ends there too; a prompt without it runs to LENGTH."""
    said = [byte_tokenizer.encode(text).ids for text in ("one; two; three", "no stop in here")]
    package = Scripted(said)
    new = 15
    steps, whole = streamed(package, byte_tokenizer, max_new_tokens=new, stop=["; t"])
    ended = len("one; t")  # the token that completes the stop string
    assert texts_of(steps) == ["one", "no stop in here"]
    assert [step.finish[0] for step in steps] == [None] * (ended - 1) + [STOP] + [None] * (
        new - ended
    )
    assert steps[-1].finish == [None, LENGTH]
    assert [step.text[0] for step in steps[ended:]] == [""] * (new - ended)
    pad = package.generation.pad_token_id or 0  # no pad id and no eos ids: 0
    assert whole[0].tolist() == said[0][:ended] + [pad] * (new - ended)
    assert torch.equal(torch.stack([step.ids for step in steps], 1), whole)
    assert whole[1].tolist() == said[1]


def test_an_empty_stop_string_is_refused_in_one_line(byte_tokenizer):
    package = Scripted([byte_tokenizer.encode("abc").ids])
    with pytest.raises(GenerationInputError, match="^stop string '' is not a non-empty string"):
        streamed(package, byte_tokenizer, max_new_tokens=2, stop=["x", ""])


class ScriptedPackage(Scripted):
    """Scripted, with what ChatSession uses of a Package: its tokenizer and `stream`."""

    def __init__(self, scripts: list[list[int]], tokenizer, eos_token_ids: tuple):
        super().__init__(scripts, eos_token_ids)
        self.tokenizer = tokenizer

    def stream(self, prompts: list, *, text: bool, **options):
        return stream(self, torch.tensor(prompts), tokenizer=self.tokenizer, text=text, **options)


CUTS = {  # options, what the model says, the reply, its tokens, whether it was cut
    "length": ({}, "abcdefg", "abcde", 5, True),
    "eos": ({}, "ab!defg", "ab!", 3, False),
    "stop-at-the-last-token": ({"stop": ["de"]}, "abcdefg", "abc", 5, False),
    "ignore-eos": ({"ignore_eos": True}, "ab!defg", "ab!de", 5, True),
}


@pytest.mark.parametrize("options, said, reply, made, cut", CUTS.values(), ids=CUTS)
def test_a_chat_reply_is_cut_when_the_engine_ended_it_at_its_length(
    byte_tokenizer, options, said, reply, made, cut
):
    """ChatSession.cut (`aotc chat`'s "the reply stopped at --max-new-tokens") is the engine's
    LENGTH, no longer worked out again from the package's eos ids ("!" here) and the count of
    tokens: a reply whose 5th and last token completes a stop string is not cut, one that went
    past an eos id with ignore_eos is."""
    from aotc_runtime.chat_session import ChatSession

    eos = byte_tokenizer.encode("!").ids[0]
    package = ScriptedPackage([byte_tokenizer.encode(said).ids], byte_tokenizer, (eos,))
    template = SimpleNamespace(prompt_ids=lambda _tokenizer, _messages: [0])
    session = ChatSession(package, template, max_new_tokens=5, **options)
    assert "".join(session.reply("hi")) == reply
    assert (session.made, session.cut) == (made, cut)


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
    assert [step.finish for step in steps] == [[None, None]] * 7 + [[LENGTH, LENGTH]]


def test_stream_and_generate_of_a_package_end_at_a_stop_string(lm):
    """`stop` reaches the engine through Package.stream and generate (the package's tokenizer
    loaded for it): the prompt ends at the token whose text completes the stop string, its text
    the text before it."""
    loaded = aotc_runtime.load(lm)
    ids = torch.tensor([[5, 17, 42]])
    free = loaded.generate(ids, max_new_tokens=8, eos_token_ids=[])[0, 3:].tolist()
    texts = [loaded.tokenizer.decode(free[: made + 1]) for made in range(8)]
    stop = f" w{free[2]} "  # a word, whole: its space after comes with the next token
    ended = next(made for made, text in enumerate(texts) if stop in text)
    assert ended < 7
    options = {"max_new_tokens": 8, "eos_token_ids": [], "stop": stop}
    steps = list(loaded.stream(ids, text=True, **options))
    whole = loaded.generate(ids, **options)[0, 3:].tolist()
    assert whole == free[: ended + 1]  # the last prompt ended: generation ends
    assert [int(step.ids[0]) for step in steps] == whole
    assert texts_of(steps) == [texts[ended].split(stop)[0]]
    assert [step.finish for step in steps] == [[None]] * ended + [[STOP]]


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
