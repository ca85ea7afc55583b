"""A model's own sampling defaults: read from its generation_config at export as transformers'
`generate` reads them (aotc/export/text_generation.py `sampling_defaults`), kept in the package's
record (checked on load), and used by `aotc serve` and `aotc chat` for what a request leaves out,
so both answer alike. No compile: the record and the protocol are checked on their own."""

from __future__ import annotations

import dataclasses
import json

import pytest
from transformers import GenerationConfig

import aotc_runtime
from aotc.export.text_generation import sampling_defaults
from aotc_runtime.fields import FieldError, Fields
from aotc_runtime.generation_record import Generation
from aotc_runtime.sampling import Sampling

pytest.importorskip("ray.serve")
from aotc_runtime.serve.completions import parse_completion  # noqa: E402


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, {"temperature": 0.0}),  # transformers' default: greedy
        ({"repetition_penalty": 1.1}, {"temperature": 0.0, "repetition_penalty": 1.1}),
        (
            {"do_sample": True, "temperature": 0.6, "top_p": 0.9},
            {"temperature": 0.6, "top_k": 50, "top_p": 0.9},  # top_k 50: transformers' default
        ),
        (
            {"do_sample": True, "top_k": 0, "min_p": 0.05},
            {"temperature": 1.0, "top_p": 1.0, "min_p": 0.05},
        ),
        (
            {"do_sample": True, "temperature": 1e-9},
            {"top_k": 50, "top_p": 1.0},
        ),  # below 0.01: left out
    ],
    ids=["greedy", "greedy-penalized", "llama-instruct-like", "top-k-off", "tiny-temperature"],
)
def test_the_models_generation_config_becomes_generates_defaults(config, expected):
    assert sampling_defaults(GenerationConfig(**config)) == expected


def record(**defaults) -> Generation:
    data = {"batch_size": 2, "max_seq_len": 32, "vocab_size": 512, "eos_token_ids": [],
            "sampling_defaults": defaults}  # fmt: skip
    return Generation.read(Fields(data, "generation"))


def test_the_record_keeps_its_defaults_and_refuses_values_out_of_range():
    kept = record(temperature=0.7, top_k=20, repetition_penalty=1.2)
    assert kept.default_sampling() == Sampling(temperature=0.7, top_k=20, repetition_penalty=1.2)
    assert kept.to_json()["sampling_defaults"] == {
        "temperature": 0.7,
        "top_k": 20,
        "repetition_penalty": 1.2,
    }
    assert record().default_sampling() == Sampling()  # greedy where nothing is recorded
    for bad, words in (
        ({"temperature": -1}, "temperature -1 is outside the accepted values"),
        ({"seed": 3}, "is not an object of temperature, top_k, top_p, min_p, repetition_penalty"),
    ):
        with pytest.raises(FieldError) as caught:  # load() makes it a PackageError naming the file
            record(**bad)
        assert "sampling_defaults" in str(caught.value) and words in str(caught.value)


def test_serve_takes_the_models_defaults_for_what_a_request_leaves_out():
    generation = record(temperature=0.7, top_k=20, repetition_penalty=1.2)
    body = {"prompt": [5, 17], "max_tokens": 2}
    left_out = parse_completion(json.dumps(body).encode(), generation).choices[0].request.sampling
    # an unseeded sampled answer draws a fresh seed (the server's rule): the rest is the model's
    expected = Sampling(temperature=0.7, top_k=20, repetition_penalty=1.2)
    assert dataclasses.replace(left_out, seed=None) == expected
    named = {**body, "temperature": 0, "repetition_penalty": 1.0}
    given = parse_completion(json.dumps(named).encode(), generation).choices[0].request.sampling
    assert given.greedy and given.repetition_penalty == 1.0 and given.top_k == 20
    plain = parse_completion(json.dumps(body).encode(), record()).choices[0].request.sampling
    assert plain.greedy  # a model that does not sample: greedy, as its `generate`


def test_a_built_package_records_its_models_defaults_and_serve_says_them(chat_lm):
    """The zoo's GPT-2 does not sample by default: greedy, in the manifest and /v1/metadata."""
    from aotc_runtime.serve.app import ServeOptions, check_package, metadata

    package = aotc_runtime.load(chat_lm)
    assert package.generation.sampling_defaults == {"temperature": 0.0}
    options = ServeOptions(package=chat_lm)
    info = metadata(check_package(options), options, 1)
    assert info["generation"]["sampling_defaults"]["temperature"] == 0.0
