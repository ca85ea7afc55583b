"""A byte-level BPE tokenizer trained in milliseconds on a few JSON texts (nothing downloaded): its
tokens span JSON's punctuation as real tokenizers' do ('{"', '":', 'Ġ"'), so a grammar's mask has to
allow tokens that cross its own boundaries. Id 0 is its end-of-sequence token."""

from __future__ import annotations

import json

EOS = 0
SIZE = 300  # the tokenizer's words; a fake package's vocabulary may be larger
SAMPLES = [
    {"name": "Ada", "age": 36, "tags": ["math", "code"], "ok": True, "score": 1.5},
    {"items": [{"id": 1, "kind": "a"}, None], "city": "Paris", "country": "FR", "n": -2},
    {"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}},
]


def json_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SIZE,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [json.dumps(sample) for sample in SAMPLES] + ["<tool_call>", "</tool_call>"]
    tokenizer.train_from_iterator(texts * 20, trainer)
    return tokenizer
