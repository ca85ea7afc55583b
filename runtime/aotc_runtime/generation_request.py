"""What one sequence asks of a text-generation package, and when it is finished: the one request
type that `generate`, `stream`, `aotc generate` and `aotc serve` build and the decode engine
(decode_engine.py) runs. The C++ runner's `aotc::GenerationRequest` (runtime/cpp/include/aotc/
package.h) holds the same fields.

A sequence finishes at the first of: an end-of-sequence id (FinishReason.STOP; never with
`ignore_eos`, as vLLM's option of that name), its `max_new_tokens`-th token (FinishReason.LENGTH),
or a stop string in its text (STOP). The decode engine decides, for every front end: the first two
by `finish_reason`, the third by the row's text (text_delta.py).

`logprobs` asks for each new token's log-probability and those of the `logprobs` most likely
tokens at its step (0: the chosen token's only; at most sampling.MAX_LOGPROBS), from the
package's raw logits (decode_engine.Made carries them).

`grammar` (token_grammar.TokenGrammar, Python front ends only: the C++ runner has none) holds the
sequence's text to a JSON schema or a grammar: each step picks among the tokens it allows, and the
sequence finishes (STOP) as soon as the grammar is complete.

A request is checked once for each rule: what it asks in itself when it is made (an invalid one
cannot exist: a prompt of whole token ids, at least one new token, its Sampling already checked
when that was made, its logprobs count), and what a package must hold for it by `check(generation)`
(the vocabulary, the KV cache's room, the grammar's vocabulary), once per package: the decode
engine calls it at join, and a front end that must refuse before it answers (HTTP's 400) calls it
first, which leaves the engine's call nothing to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import GenerationInputError
from .finish_reason import FinishReason
from .generation_record import Generation
from .sampling_settings import GREEDY, MAX_LOGPROBS, Sampling, is_whole_number


@dataclass(frozen=True)
class GenerationRequest:
    prompt: tuple  # token ids, at least one
    max_new_tokens: int
    sampling: Sampling = GREEDY
    eos_token_ids: tuple | None = None  # None: the package's
    stop: tuple = ()  # stop strings: with the package's tokenizer, the engine reads the text
    ignore_eos: bool = False  # go on past end-of-sequence ids, to max_new_tokens
    logprobs: int | None = None  # None: none; k: the chosen token's and the k most likely
    grammar: Any = None  # a token_grammar.TokenGrammar the text is held to, or None
    # the package's Generation this request was last checked against (`check`)
    _checked_for: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.prompt:
            raise GenerationInputError("the prompt is empty; give at least one token")
        # plain ints from 0 pass at C speed (a long prompt, made n times for `n` answers)
        if not all(type(token) is int for token in self.prompt) or min(self.prompt) < 0:
            for token in self.prompt:
                if not is_whole_number(token) or token < 0:
                    raise GenerationInputError(
                        f"token id {token!r} is outside the vocabulary (ids are whole numbers "
                        "from 0)"
                    )
        if not is_whole_number(self.max_new_tokens) or self.max_new_tokens < 1:
            raise GenerationInputError(
                f"max_new_tokens is {self.max_new_tokens!r}; ask for at least 1 (a whole number)"
            )
        if not isinstance(self.sampling, Sampling):
            raise GenerationInputError(
                f"sampling is a {type(self.sampling).__name__}; give an aotc_runtime Sampling"
            )
        problem = check_logprobs(self.logprobs)
        if problem:
            raise GenerationInputError(problem)
        for string in self.stop:  # an empty one would end every sequence at its first token
            if not isinstance(string, str) or not string:
                raise GenerationInputError(
                    f"stop string {string!r} is not a non-empty string; give text, or leave stop "
                    "out"
                )

    def eos(self, generation: Generation) -> tuple:
        return generation.eos_token_ids if self.eos_token_ids is None else self.eos_token_ids

    def finish_reason(self, generation: Generation, token: int, made: int) -> FinishReason | None:
        """Why the sequence ends with `token`, its `made`-th new token, or None if it goes on."""
        if not self.ignore_eos and token in self.eos(generation):
            return FinishReason.STOP
        if made >= self.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def check(self, generation: Generation) -> GenerationRequest:
        """One line naming what the package cannot run of this request, and the fix; the request
        itself when the package runs it. Every id the engine feeds the model is checked here: the
        compiled model's own bounds checks end the process. Checked once per package: a second
        call for the same package returns at once."""
        if self._checked_for is generation:
            return self
        vocab = generation.vocab_size
        if max(self.prompt) >= vocab:
            bad = next(token for token in self.prompt if token >= vocab)
            raise GenerationInputError(
                f"token id {bad!r} is outside the vocabulary (0..{vocab - 1})"
            )
        check_room(generation, len(self.prompt), self.max_new_tokens)
        if self.eos_token_ids is not None:
            check_eos(generation, self.eos_token_ids)
        if self.grammar is not None and self.grammar.vocab_size != vocab:
            raise GenerationInputError(
                f"the grammar was made for a vocabulary of {self.grammar.vocab_size} tokens, not "
                f"this package's {vocab}; make it from this package's tokenizer"
            )
        object.__setattr__(self, "_checked_for", generation)
        return self


def check_logprobs(logprobs: object) -> str | None:
    """Why `logprobs` is not None or a count of most likely tokens to report, or None."""
    if logprobs is None:
        return None
    if (
        isinstance(logprobs, int)
        and not isinstance(logprobs, bool)
        and 0 <= logprobs <= MAX_LOGPROBS
    ):
        return None
    return (
        f"logprobs {logprobs!r} is not a whole number from 0 to {MAX_LOGPROBS} (the most likely "
        "tokens to report beside the chosen one)"
    )


def check_room(generation: Generation, length: int, max_new_tokens: int) -> None:
    """A prompt of `length` tokens and `max_new_tokens` new ones fit a row of the KV cache."""
    if not is_whole_number(max_new_tokens) or max_new_tokens < 1:
        raise GenerationInputError(
            f"max_new_tokens is {max_new_tokens!r}; ask for at least 1 (a whole number)"
        )
    if length + max_new_tokens > generation.max_seq_len:
        room = generation.max_seq_len - max_new_tokens
        fix = (
            f"shorten the prompt to at most {room} tokens, ask for fewer new tokens,"
            if room >= 1
            else f"ask for at most {generation.max_seq_len - length} new tokens"
        )
        raise GenerationInputError(
            f"a prompt of {length} tokens and {max_new_tokens} new tokens need "
            f"{length + max_new_tokens} positions, but the package's KV cache holds "
            f"{generation.max_seq_len}; {fix} or export with a larger --max-seq-len"
        )


def check_eos(generation: Generation, eos_token_ids: Sequence) -> None:
    vocab = generation.vocab_size
    for token in eos_token_ids:
        if not is_whole_number(token) or not 0 <= token < vocab:
            raise GenerationInputError(
                f"end-of-sequence id {token!r} is outside the vocabulary (0..{vocab - 1}); "
                "give token ids of this model"
            )


def eos_tuple(eos_token_ids: Sequence[int] | int | None) -> tuple | None:
    """A caller's end-of-sequence ids (a list, one id, or None for the package's) as a tuple."""
    if eos_token_ids is None:
        return None
    try:
        return tuple(eos_token_ids)  # type: ignore[arg-type]
    except TypeError:
        return (eos_token_ids,)


def pad_id(generation: Generation, eos: Sequence[int]) -> int:
    """The id a finished sequence's row shows in a batch's later steps (transformers' padding of
    `generate`'s result): the package's pad id, else the first end-of-sequence id, else 0."""
    if generation.pad_token_id is not None:
        return generation.pad_token_id
    return eos[0] if eos else 0
