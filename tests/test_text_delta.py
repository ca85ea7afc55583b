"""A row's text as its tokens come (text_delta.TextDelta): the pieces sent make the row's text
decoded whole, cut at the first stop string, each piece whole characters, in the step the old
whole-row decoding sent them; and a row costs decoding work linear in its length. Three tokenizers
made here from a few sentences (nothing downloaded): GPT-2's byte-level BPE, a Metaspace BPE (its
decoder drops the first token's "▁"), and a Llama-style one with byte fallback."""

from __future__ import annotations

import json
import random

import pytest

from aotc_runtime.text_delta import TextDelta, cut_at_stop

TRAINING = [
    "héllo wörld ✓ 日本語 😀",
    "hello world, the quick brown fox jumps over the lazy dog.",
    "wörld of 日本 and 語, ✓ marks 😀 and END of the end.",
    "Stop here: the END.  Two  spaces, a tab\tand a new line\n.",
]
TEXTS = [
    "héllo wörld ✓ 日本語 😀",
    "😀😀 日本語の wörld, héllo ✓✓ END of the text",
    "the end.  Two  spaces\tand\na new line, héllo END",
    " a leading space, then wörld 語",
]


def byte_level():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"]
    )
    tokenizer.train_from_iterator(TRAINING, trainer)
    return tokenizer


def metaspace():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=90, special_tokens=["<unk>", "<sep>"])
    tokenizer.train_from_iterator(TRAINING, trainer)
    return tokenizer


def byte_fallback():
    """Llama 2's shape: "▁" for spaces, characters out of the vocabulary as <0xXX> byte tokens,
    the decoder's Strip dropping the text's first space."""
    from tokenizers import Tokenizer, models, normalizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    ascii_only = [s.encode("ascii", "ignore").decode() for s in TRAINING]
    trainer = trainers.BpeTrainer(vocab_size=70, special_tokens=["<unk>", "<s>"])
    tokenizer.train_from_iterator(ascii_only, trainer)
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    vocab.update({f"<0x{b:02X}>": len(vocab) + b for b in range(256)})
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    return Tokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="module", params=[byte_level, metaspace, byte_fallback])
def tokenizer(request):
    return request.param()


def pieces(tokenizer, ids: list, stop: tuple = ()) -> list[tuple[str, bool]]:
    """What TextDelta sends for each token, up to the one a stop string ends; the last token is
    `last`."""
    delta, sent = TextDelta(tokenizer, stop), []
    for number, token in enumerate(ids):
        sent.append(delta.add(token, last=number == len(ids) - 1))
        if sent[-1][1]:
            break
    return sent


def whole_row_pieces(tokenizer, ids: list, stop: tuple = ()) -> list[tuple[str, bool]]:
    """The reference: what the whole row decoded at every token gives (quadratic, as TextDelta
    was): the text past what was sent, less the unfinished characters and the tail that could
    still become a stop string."""
    hold = max((len(s) for s in stop), default=1) - 1
    sent, length = [], 0
    for number in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:number])
        cut, stopped = cut_at_stop(text, stop)
        end = len(cut) if stopped or number == len(ids) else len(text.rstrip("\ufffd")) - hold
        sent.append((cut[length:end] if end > length else "", stopped))
        length = max(length, end)
        if stopped:
            break
    return sent


def test_a_character_split_across_tokens_is_in_these_texts(tokenizer):
    """The tests below feed characters whose bytes span tokens (not for the Metaspace one: its
    vocabulary holds characters)."""
    if tokenizer.decoder.__class__.__name__ == "Metaspace":
        pytest.skip("its tokens are whole characters")
    ids = [i for text in TEXTS for i in tokenizer.encode(text).ids]
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)


@pytest.mark.parametrize("text", TEXTS)
def test_the_pieces_make_the_row_decoded_whole_each_whole_characters(tokenizer, text):
    ids = tokenizer.encode(text).ids
    sent = pieces(tokenizer, ids)
    assert "".join(piece for piece, _ in sent) == tokenizer.decode(ids)
    assert not any(stopped for _, stopped in sent)
    assert all("\ufffd" not in piece for piece, _ in sent)
    assert sent == whole_row_pieces(tokenizer, ids)  # each in the step of its last byte


STOPS = [("END",), ("wörld",), ("日本",), ("😀 ",), ("ld, h", "end."), ("\n",), ("never",)]


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("text", TEXTS)
def test_a_stop_string_ends_the_text_before_it(tokenizer, text, stop):
    """Stop strings that span tokens (and characters' bytes that do): the text up to the first,
    which is left out; none sent before it could be ruled out."""
    ids = tokenizer.encode(text).ids
    sent = pieces(tokenizer, ids, stop)
    whole = tokenizer.decode(ids)
    expected, stopped = cut_at_stop(whole, stop)
    assert "".join(piece for piece, _ in sent) == expected
    assert sent[-1][1] == stopped and not any(s for _, s in sent[:-1])
    assert sent == whole_row_pieces(tokenizer, ids, stop)


def test_the_tail_that_could_begin_a_stop_string_is_held_until_the_last_token(tokenizer):
    ids = tokenizer.encode("the END").ids
    held = pieces(tokenizer, ids, ("ENDING",))
    assert "".join(piece for piece, _ in held) == tokenizer.decode(ids)  # `last` sends it
    assert held[-1][0].endswith("END") and not held[-1][1]


def test_special_and_random_tokens_read_as_the_whole_row(tokenizer):
    """Ids no sentence gives: special tokens (they decode to no text) anywhere, bytes that make
    no character (byte-level). Not byte fallback's <0xXX> tokens: a byte that
    makes no character turns its run's earlier bytes, whole characters read already, into U+FFFD
    too, and those keep their first reading (as in vLLM's and the tokenizers library's DecodeStream)."""
    vocab = tokenizer.get_vocab()
    choices = sorted(i for token, i in vocab.items() if not token.startswith("<0x"))
    generator = random.Random(0)
    for _ in range(20):
        ids = [generator.choice(choices) for _ in range(40)]
        ids[generator.randrange(40)] = 0  # a special token
        assert pieces(tokenizer, ids) == whole_row_pieces(tokenizer, ids)
        assert pieces(tokenizer, ids, ("ab", "e")) == whole_row_pieces(tokenizer, ids, ("ab", "e"))


class CountingTokenizer:
    """The tokenizer, counting the ids it is given to decode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, **kwargs):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **kwargs)


def test_a_row_costs_decoding_linear_in_its_length(tokenizer):
    """4,000 tokens decode about 3 ids each (decoding the whole row each time: 8 million)."""
    ids = []
    while len(ids) < 4000:
        ids += tokenizer.encode(" ".join(TEXTS)).ids
    ids = ids[:4000]
    counting = CountingTokenizer(tokenizer)
    sent = pieces(counting, ids, ("never", "not this"))
    assert "".join(piece for piece, _ in sent) == tokenizer.decode(ids)
    assert counting.decoded < 20 * len(ids)


def test_tokens_that_never_make_a_character_still_cost_linear_decoding():
    """A model (a hostile checkpoint) that makes only UTF-8 continuation bytes, or only special
    tokens: no character ever ends, and the window of unread ids is still held to a few."""
    tokenizer = byte_level()
    continuation = tokenizer.token_to_id(byte_level_character(0x80))
    special = tokenizer.token_to_id("<|endoftext|>")
    for token in (continuation, special):
        counting = CountingTokenizer(tokenizer)
        sent = pieces(counting, [token] * 4000)
        assert counting.decoded < 40 * 4000, counting.decoded
        if token == special:
            assert "".join(piece for piece, _ in sent) == ""


def byte_level_character(value: int) -> str:
    """The character GPT-2's byte-level alphabet (its bytes_to_unicode) writes for a byte."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    if value in printable:
        return chr(value)
    others = [b for b in range(256) if b not in printable]
    return chr(256 + others.index(value))
