"""The sampling limits have one owner, aotc_runtime/sampling_settings.py (torch-free), which the
runtime's checks, `aotc serve`'s request fields and the CLI's options all read: each front end
takes the owner's bound and refuses one past it, in its own words. The CLI's options once held
copies of MAX_SEED and MAX_LOGPROBS, and serve's fields one of MAX_LOGPROBS."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import invoke

from aotc_runtime import Generation
from aotc_runtime.generation_request import check_logprobs
from aotc_runtime.sampling_settings import MAX_LOGPROBS, MAX_SEED, InvalidSampling, Sampling
from aotc_runtime.serve.completions import parse_completion
from aotc_runtime.serve.protocol import RequestError

GENERATION = Generation(batch_size=4, max_seq_len=32, vocab_size=512)


def completion(**fields):
    return parse_completion(json.dumps({"prompt": [1], **fields}).encode(), GENERATION)


def test_the_owner_and_the_cli_options_import_no_torch():
    """The CLI reads the bounds for --help without importing torch."""
    code = (
        "import sys, aotc_runtime.sampling_settings, aotc.cli.generate, aotc.cli.sampling_options;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_logprobs_past_the_owners_bound_are_refused_by_every_front_end(tmp_path):
    assert check_logprobs(MAX_LOGPROBS) is None
    assert f"from 0 to {MAX_LOGPROBS}" in check_logprobs(MAX_LOGPROBS + 1)
    assert completion(logprobs=MAX_LOGPROBS).decoding.logprobs == MAX_LOGPROBS
    with pytest.raises(RequestError) as caught:
        completion(logprobs=MAX_LOGPROBS + 1)
    assert caught.value.status == 400 and caught.value.param == "logprobs"
    # click checks the option before the package is read: any folder shows it
    done = invoke("generate", "--logprobs", MAX_LOGPROBS + 1, "--json", tmp_path)
    assert done.exit_code == 2
    assert f"{MAX_LOGPROBS + 1} is not in the range 0<=x<={MAX_LOGPROBS}" in done.stderr


def test_seeds_past_the_owners_bound_are_refused_by_every_front_end(tmp_path):
    assert Sampling(temperature=1.0, seed=MAX_SEED).seed == MAX_SEED
    with pytest.raises(InvalidSampling, match="seed") as refused:
        Sampling(temperature=1.0, seed=MAX_SEED + 1)
    assert refused.value.field == "seed"
    assert completion(seed=MAX_SEED).decoding.sampling.seed == MAX_SEED
    with pytest.raises(RequestError) as caught:
        completion(seed=MAX_SEED + 1)
    assert caught.value.status == 400 and caught.value.param == "seed"
    for command in ("generate", "chat"):
        done = invoke(command, "--seed", MAX_SEED + 1, tmp_path)
        assert done.exit_code == 2, command
        assert f"0<=x<={MAX_SEED}" in done.stderr, command
