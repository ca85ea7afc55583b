"""Text generation with a package built from `aotc export --task text-generation`: the batch front
end (`Package.generate` and `Package.stream`) over the decode engine (decode_engine.py), which runs
every generation.

`generate` answers as transformers' `generate` does for a decoder-only model: prompts of
different lengths come left-padded with an attention mask, the result is the prompts followed by
the new tokens, and a sequence that produced an end-of-sequence token gets the pad token after it
until every sequence has ended or `max_new_tokens` is reached. Each prompt is one GenerationRequest
in the engine, all joining at the first step. One generation at a time runs on a package (its cache
is one), others wait.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .decode_engine import DecodeEngine, Made
from .decode_step import pack
from .errors import (
    GenerationInputError,
    MissingDependencyError,
    NonFiniteLogitsError,
    PackageError,
)
from .finish_reason import FinishReason
from .generation_request import (
    GenerationRequest,
    eos_tuple,
    pad_id,
)
from .prefix_cache import PrefixCache
from .sampling import GREEDY, Sampling, is_whole_number

if TYPE_CHECKING:
    from .decode_engine import GeneratingPackage
    from .generation_record import Generation


def prefill_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list:
    """The step's inputs (decode_step.pack) that feed each row of `input_ids` [B, S] its prompt,
    the tokens `attention_mask` marks 1, in order (a mask with 0s among the 1s means what
    transformers makes of it: the 0s are not there), into an empty cache, picking each row's last
    token."""
    feeds = [
        (row, 0, ids[mask.bool()].tolist())
        for row, (ids, mask) in enumerate(zip(input_ids, attention_mask))
    ]
    return pack(feeds)


def load_tokenizer(package: GeneratingPackage) -> Any:  # a tokenizers.Tokenizer
    """The tokenizer the package carries (`aotc export --tokenizer`), read with the `tokenizers`
    library: a JSON file, nothing in it runs."""
    generation = package.generation
    if generation.tokenizer is None:
        raise GenerationInputError(
            f"package {package.path} carries no tokenizer; give token ids, or export with "
            "--tokenizer DIR"
        )
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MissingDependencyError(
            "text prompts need the `tokenizers` library; pip install tokenizers"
        ) from None
    import json

    from .tokenizer_bounds import tokenizer_growth_problem

    path = package.path / generation.tokenizer
    try:
        # the package's file, hashed when it was loaded: parsed here for its bounds first
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        data = None  # not a JSON file: the library's reading below says what is wrong
    problem = tokenizer_growth_problem(data)
    if problem is not None:
        raise PackageError(
            f"package {package.path}: its tokenizer {generation.tokenizer} is refused: {problem}; "
            "export the model with its own tokenizer"
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises plain Exceptions with its parser's text
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise PackageError(
            f"package {package.path}: its tokenizer {generation.tokenizer} is not one the "
            f"`tokenizers` library reads ({first}); rebuild it with `aotc build --force`"
        ) from None


def check_request(
    generation: Generation, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> None:
    """One line naming what of the tensors the package cannot serve, and the fix: their shape and
    type, the batch, the mask. Each prompt's ids, its room in the cache and its sampling are its
    GenerationRequest's to check (once, as every front end's): the compiled model's own bounds
    checks end the process."""
    if not isinstance(input_ids, torch.Tensor):
        raise GenerationInputError(
            f"input_ids must be a 2-D tensor of token ids [prompts, tokens], got a "
            f"{type(input_ids).__name__}; pass torch.tensor(ids)"
        )
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
        raise GenerationInputError(
            f"input_ids must be a 2-D tensor of token ids [prompts, tokens], got "
            f"{str(input_ids.dtype).split('.')[-1]}{list(input_ids.shape)}"
        )
    prompts, length = input_ids.shape
    if prompts == 0 or length == 0:
        raise GenerationInputError("the prompt is empty; give at least one token")
    if prompts > generation.batch_size:
        raise GenerationInputError(
            f"{prompts} prompts, but the package generates for at most {generation.batch_size} at "
            "once; split them, or export with a larger --batch-size"
        )
    if attention_mask is not None:
        check_mask(attention_mask, input_ids)


def check_mask(attention_mask: torch.Tensor, input_ids: torch.Tensor) -> None:
    """A mask of 0s and 1s, one per token, with a 1 in every prompt: its running count becomes
    each token's position id, which indexes the model's position tables."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = list(getattr(attention_mask, "shape", [])) or type(attention_mask).__name__
        raise GenerationInputError(
            f"attention_mask is {shape}, input_ids {list(input_ids.shape)}; give one mask entry "
            "(0 or 1) per token"
        )
    if attention_mask.is_complex() or not bool(
        ((attention_mask == 0) | (attention_mask == 1)).all()
    ):
        raise GenerationInputError(
            "attention_mask holds values other than 0 and 1; give 1 for a token and 0 for padding"
        )
    if bool((attention_mask.sum(-1) == 0).any()):
        raise GenerationInputError("a prompt is empty (its attention mask is all 0)")


class StepLogprobs(NamedTuple):
    """A step of `stream(..., logprobs=k)`: the new tokens [prompts], each one's log-probability
    [prompts] (NaN for a prompt that had ended, whose token is the pad), and the k most likely
    tokens' ids and log-probabilities [prompts, k], most likely first: the log-softmax of the
    package's raw logits at that step (before penalties and temperature). On the CPU."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor

    @property
    def ids(self) -> torch.Tensor:
        """The new tokens, by the name TextStep gives them."""
        return self.tokens


class TextStep(NamedTuple):
    """A step of `stream(..., text=True)`, as the decode engine made it (its Made events): the new
    tokens [prompts] (the pad id for a prompt that had ended), each prompt's new text ("" while a
    character is unfinished, and after its end), with `logprobs` the step's StepLogprobs (else
    None), and why each prompt ended (a FinishReason at its last token, else None)."""

    ids: torch.Tensor
    text: list[str]
    logprobs: StepLogprobs | None = None
    finish: list[FinishReason | None] | None = None


def stop_strings(stop: str | Sequence[str]) -> tuple:
    """`stop`, a string or a sequence of them, as the tuple a GenerationRequest holds (which
    refuses an empty one)."""
    return (stop,) if isinstance(stop, str) else tuple(stop)


def stream(
    package: GeneratingPackage,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    eos_token_ids: Sequence[int] | None = None,
    ignore_eos: bool = False,
    logprobs: int | None = None,
    prefix_cache: PrefixCache | None = None,
    tokenizer: Any = None,  # a tokenizers.Tokenizer: the engine reads the text with it
    text: bool = False,
    stop: str | Sequence[str] = (),
) -> Iterator[Any]:  # torch.Tensor, StepLogprobs with logprobs, TextStep with text
    """Yields each step's new tokens [prompts] (on the CPU) as they come: each prompt a
    GenerationRequest joining the decode engine at its first step (the prompts' prefill is one
    step), then one token a step for every prompt still going, the pad id for one that ended. At
    most the package's batch of prompts; fewer are answered as if the others were not there.
    `ignore_eos` goes on past end-of-sequence ids to `max_new_tokens`; with `logprobs` (0 to
    sampling.MAX_LOGPROBS) each step is a StepLogprobs. With a `prefix_cache` (kept across calls,
    as a chat keeps one), a prompt that starts as a row of the cache holds is fed the rest. With
    the package's `tokenizer` a prompt also ends at a `stop` string in its text, and with `text`
    each step is a TextStep. Where each prompt ends, and its text, are the engine's (its Made
    events), as in every other front end."""
    generation = package.generation
    check_request(generation, input_ids, attention_mask)
    eos = eos_tuple(eos_token_ids)
    stops = stop_strings(stop)
    if text and tokenizer is None:
        raise ValueError("text steps are the engine's text: give the package's tokenizer")
    top_count = min(logprobs or 0, generation.vocab_size)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    # a row's prompt is its tokens the mask marks 1, in order (prefill_inputs's reading)
    prompts = [ids[keep.bool()].tolist() for ids, keep in zip(input_ids.cpu(), mask.cpu())]
    pad = pad_id(generation, generation.eos_token_ids if eos is None else eos)
    whole = generation.max_seq_len  # every prompt in one step
    engine = DecodeEngine(
        package, prefill_chunk=whole, step_tokens=whole * generation.batch_size,
        tokenizer=tokenizer, prefix_cache=prefix_cache,
    )  # fmt: skip
    try:
        for row, prompt in enumerate(prompts):
            request = GenerationRequest(
                tuple(prompt),
                max_new_tokens,
                sampling,
                eos,
                stop=stops,
                ignore_eos=ignore_eos,
                logprobs=logprobs,
            )
            engine.join(row, request)
        while engine.active:
            new = torch.full((len(prompts),), pad, dtype=torch.int64)
            steps = engine.step()
            for made in steps:
                if made.finish is FinishReason.ERROR:
                    raise NonFiniteLogitsError(
                        f"the package's logits for prompt {made.key} were not finite (NaN or "
                        "infinite) at one of its steps: its weights, its dtype's range or its "
                        "inputs; check the package with `aotc verify`, or build it in float32"
                    )
                new[made.key] = made.token  # type: ignore[index]  # the keys are row numbers
            step: Any = new if logprobs is None else with_logprobs(new, steps, top_count)
            if text:
                step = text_step(new, steps, None if logprobs is None else step)
            with package.generation_gate.paused():
                yield step
    finally:  # read to the end, or closed: the package is free again
        engine.release()


def text_step(tokens: torch.Tensor, steps: Sequence[Made], logprobs: Any) -> TextStep:
    """A step's tokens [prompts] with the text and the finish its Made rows carry (keyed by row):
    a prompt that had ended has none."""
    texts: list[str] = [""] * len(tokens)
    finishes: list[FinishReason | None] = [None] * len(tokens)
    for made in steps:
        row: int = made.key  # type: ignore[assignment]  # the keys are row numbers
        texts[row], finishes[row] = made.text, made.finish
    return TextStep(tokens, texts, logprobs, finishes)


def with_logprobs(tokens: torch.Tensor, steps: Sequence[Any], count: int) -> StepLogprobs:
    """A step's tokens [prompts] with the log-probabilities its Made rows carry (keyed by row)."""
    chosen = torch.full(tokens.shape, float("nan"))
    top_ids = torch.zeros(len(tokens), count, dtype=torch.int64)
    top_logprobs = torch.full((len(tokens), count), float("-inf"))
    for made in steps:
        row = made.key
        chosen[row] = made.logprob
        for rank, (token, value) in enumerate(made.top_logprobs):
            top_ids[row, rank], top_logprobs[row, rank] = token, value
    return StepLogprobs(tokens, chosen, top_ids, top_logprobs)


def left_padded(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [prompts, longest] of token-id lists of different lengths,
    left-padded with 0 as transformers pads a batch for generation."""
    for prompt in prompts:
        for token in prompt:
            if not is_whole_number(token) or not 0 <= token < 2**63:
                raise GenerationInputError(
                    f"token id {token!r} is not a token id (a whole number from 0 below the "
                    "vocabulary's size)"
                )
    longest = max(len(prompt) for prompt in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.int64)
        mask[row, longest - len(prompt) :] = 1
    return ids, mask


def with_prompts(input_ids: torch.Tensor, steps: Iterator[torch.Tensor]) -> torch.Tensor:
    """The prompts [prompts, tokens] followed by the new tokens `stream` yields, [prompts, tokens
    + new] (on the CPU), as transformers' `generate` returns them."""
    new = torch.stack(list(steps), 1)  # first: the steps check the request
    return torch.cat([input_ids.cpu().to(torch.int64), new], dim=1)
