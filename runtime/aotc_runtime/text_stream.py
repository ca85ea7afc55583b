"""`Package.stream(..., text=True)`: each step's new tokens with the text they add, per prompt,
decoded incrementally (text_delta.TextDelta) so a character whose bytes span several tokens comes
whole, in the step of its last byte."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from .text_delta import TextDelta


class TextStep(NamedTuple):
    """A step of `stream(..., text=True)`: the new tokens [prompts] (the pad id for a prompt that
    had ended), each prompt's new text ("" while a character is unfinished, and after its end), and,
    with `logprobs`, the step's generation.StepLogprobs (else None)."""

    ids: torch.Tensor
    text: list[str]
    logprobs: Any = None


def with_text(
    steps: Iterator[Any], tokenizer: Any, eos: tuple, ignore_eos: bool, max_new_tokens: int
) -> Iterator[TextStep]:
    """The steps of generation.stream, each with its text. A prompt ends at an end-of-sequence id
    (unless `ignore_eos`) or its `max_new_tokens`-th token, as GenerationRequest.finish_reason
    says; its tokens after that are the pad and add no text."""
    deltas: list[TextDelta] | None = None
    ended: list[bool] = []
    for number, step in enumerate(steps):
        ids = step if isinstance(step, torch.Tensor) else step.tokens
        if deltas is None:
            deltas = [TextDelta(tokenizer, ()) for _ in range(len(ids))]
            ended = [False] * len(ids)
        texts = []
        for row, token in enumerate(ids.tolist()):
            if ended[row]:
                texts.append("")
                continue
            last = number + 1 >= max_new_tokens or (not ignore_eos and token in eos)
            texts.append(deltas[row].add(token, last)[0])
            ended[row] = last
        yield TextStep(ids, texts, None if isinstance(step, torch.Tensor) else step)
