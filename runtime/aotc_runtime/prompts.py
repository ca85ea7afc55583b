"""Prompts as `Package.generate` and `Package.stream` take them: a tensor of token ids [prompts,
tokens] (with an optional attention mask), or plain Python lists: a list of token-id lists, of any
lengths (left-padded, with the mask that says so, as transformers pads a batch for generation), or
one list of ids (one prompt)."""

from __future__ import annotations

from typing import Any

import torch

from .errors import GenerationInputError


def prompt_tensors(input_ids: Any, attention_mask: Any = None) -> tuple[Any, Any]:
    """(input_ids, attention_mask) as tensors; a tensor passes as it is (generation.check_request
    checks it)."""
    if isinstance(input_ids, torch.Tensor) or not isinstance(input_ids, list | tuple):
        return input_ids, attention_mask
    from .generation import left_padded

    rows = list(input_ids)
    if rows and not any(isinstance(row, list | tuple | torch.Tensor) for row in rows):
        rows = [rows]  # one prompt's ids
    if not rows or not all(isinstance(row, list | tuple) and row for row in rows):
        raise GenerationInputError(
            "input_ids must be token ids: a tensor [prompts, tokens], a list of token-id lists "
            "([[5, 17, 42]]) or one list of ids, each prompt at least one token"
        )
    if attention_mask is not None:
        raise GenerationInputError(
            "an attention_mask goes with a tensor of input_ids; prompts given as lists are "
            "left-padded and masked for you: leave attention_mask out"
        )
    return left_padded(rows)
