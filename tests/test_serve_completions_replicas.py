"""`aotc serve --replicas 2` of a text-generation package without a tokenizer (replicas work as for
/v1/predict; text with no tokenizer is a 400). Its own module, so that its server starts after
test_serve_completions.py's has stopped (one local Ray Serve at a time).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("ray.serve")

from conftest import free_port  # noqa: E402
from test_serve_completions import expected_ids, get, post  # noqa: E402

from aotc_runtime.serve.app import ServeOptions, start, stop  # noqa: E402

pytestmark = pytest.mark.slow


def test_two_replicas_answer_token_ids_each_request_its_own_and_refuse_text(generation_packages):
    lm = generation_packages["gpt2"][0]  # no tokenizer in it
    running = start(
        ServeOptions(package=lm, port=free_port(), metrics_port=free_port(), replicas=2)
    )
    try:
        status, answer = post(running.url, {"prompt": "w5 w17", "max_tokens": 2})
        assert status == 400 and "tokenizer" in answer["error"]["message"], answer
        assert answer["error"]["param"] == "prompt"
        generator = torch.Generator().manual_seed(5)
        requests = []
        for _ in range(16):
            length = int(torch.randint(1, 9, (1,), generator=generator))
            prompt = torch.randint(3, 512, (length,), generator=generator).tolist()
            requests.append({"prompt": prompt, "max_tokens": 6, "temperature": 0})
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda r: post(running.url, r), requests))
        for request, (status, answer) in zip(requests, answers):
            assert status == 200, answer
            assert answer["choices"][0]["token_ids"] == expected_ids(lm, request["prompt"], 6)
        ok, text = get(running.url, "/v1/metadata")
        assert ok == 200 and json.loads(text)["generation"]["tokenizer"] in (None, False), text
    finally:
        stop(running)
