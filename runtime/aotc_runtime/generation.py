"""Text generation with a package built from `aotc export --task text-generation`: the prompts'
prefill, then one decode step per new token, the KV cache kept as the package's state.

The package's program is one step over a KV cache in which each row has its own timeline
(aotc/export/row_cache.py):

    step(input_ids [B, S], cache_lengths [B], input_lengths [B]) -> logits [B, vocab]

row b holding cache_lengths[b] tokens and fed the last input_lengths[b] tokens of its window.

`generate` answers as transformers' `generate` does for a decoder-only model: prompts of
different lengths come left-padded with an attention mask, the result is the prompts followed by
the new tokens, and a sequence that produced an end-of-sequence token gets the pad token after it
until every sequence has ended or `max_new_tokens` is reached. One `generate` at a time runs on a
package (its cache is one), others wait.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .errors import GenerationInputError, MissingDependencyError, PackageError
from .sampling import GREEDY, RowPicker, Sampling, is_whole_number

if TYPE_CHECKING:
    from .generation_record import Generation
    from .package import Package


def prefill_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
    """The step's inputs that feed each row of `input_ids` [B, S] its prompt, the tokens
    `attention_mask` marks 1: those tokens moved, in order, to the end of the row's window (a mask
    with 0s among the 1s means what transformers makes of it: the 0s are not there), an empty
    cache, and each row's count of tokens."""
    order = attention_mask.argsort(dim=1, stable=True)  # the 0s first, then the 1s in order
    lengths = attention_mask.long().sum(-1)
    return input_ids.gather(1, order), torch.zeros_like(lengths), lengths


def generation_of(package: Package) -> Generation:
    generation = package.manifest.generation
    if generation is None:
        raise PackageError(
            f"package {package.path} is not a text-generation package; export the model with "
            "`aotc export --task text-generation --max-seq-len N` and build that"
        )
    return generation


def load_tokenizer(package: Package) -> Any:  # a tokenizers.Tokenizer
    """The tokenizer the package carries (`aotc export --tokenizer`), read with the `tokenizers`
    library: a JSON file, nothing in it runs."""
    generation = generation_of(package)
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
    try:
        return Tokenizer.from_file(str(package.path / generation.tokenizer))
    except Exception as exc:  # the library raises plain Exceptions with its parser's text
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise PackageError(
            f"package {package.path}: its tokenizer {generation.tokenizer} is not one the "
            f"`tokenizers` library reads ({first}); rebuild it with `aotc build --force`"
        ) from None


def check_request(
    generation: Generation,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    max_new_tokens: int,
    sampling: Sampling,
) -> None:
    """One line naming what the package cannot serve, and the fix. Every id the loop feeds the
    model (the prompts, the mask's positions, the pad and end-of-sequence ids it feeds back) is
    checked here: the compiled model's own bounds checks end the process."""
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
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= generation.vocab_size:
        bad = low if low < 0 else high
        raise GenerationInputError(
            f"token id {bad} is outside the vocabulary (0..{generation.vocab_size - 1})"
        )
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
    problem = sampling.check()
    if problem:
        raise GenerationInputError(problem)


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


def feedback_ids(generation: Generation, eos_token_ids: Sequence[int] | None) -> tuple[list, int]:
    """The end-of-sequence ids a generation stops at and the pad id it feeds back after them, each
    inside the vocabulary (the caller's eos ids are checked here, the package's at load)."""
    if eos_token_ids is None:
        eos = list(generation.eos_token_ids)
    else:
        try:
            eos = list(eos_token_ids)
        except TypeError:
            eos = [eos_token_ids]
        vocab = generation.vocab_size
        for token in eos:
            if not is_whole_number(token) or not 0 <= token < vocab:
                raise GenerationInputError(
                    f"end-of-sequence id {token!r} is outside the vocabulary (0..{vocab - 1}); "
                    "give token ids of this model"
                )
    pad = generation.pad_token_id
    if pad is None:
        pad = eos[0] if eos else 0  # transformers pads with the eos token then
    return eos, pad


class DecodeStep:
    """The decode step's inputs as buffers it owns and advances on the device: after a step, each
    row holds the tokens it was fed, so no host value crosses to the device per token (a host
    tensor copied to a CUDA device waits for the device to finish what it was given first).
    `DecodeGraph` captures `run` whole."""

    def __init__(self, inputs: Sequence[torch.Tensor]):
        # ids [B, 1], cache lengths [B], input lengths [B] (1 for a row decoding, 0 for none)
        self.inputs = [t.clone() for t in inputs]
        self.ids, self.cache_lengths, self.input_lengths = self.inputs

    def advance(self) -> None:
        self.cache_lengths.add_(self.input_lengths)

    def load(self, inputs: Sequence[torch.Tensor]) -> None:
        for mine, given in zip(self.inputs, inputs):
            mine.copy_(given)


class GreedyPick:
    """A greedy step's choice and end-of-sequence bookkeeping as device work on buffers it owns:
    the next tokens (the pad token for a finished sequence), the sequences still unfinished, and
    the tokens written into the decode step's ids buffer. A DecodeGraph captures it after the
    program, so a greedy token costs the host one replay and the copy of its tokens instead of a
    dozen small operations launched from Python: no host round trip but the stream's. (On a
    quiet H100 host it did not change GPT-2's 0.72 ms a token: that is the graph's own GPU time;
    docs/benchmarks.md says what it is made of. A loaded host is where it helps.)"""

    EOS_SLOTS = 8  # end-of-sequence ids a graph compares with; more fall back to eager picking

    def __init__(self, batch: int, device: torch.device):
        self.tokens = torch.zeros(batch, dtype=torch.int64, device=device)
        self.unfinished = torch.ones(batch, dtype=torch.bool, device=device)
        self.eos = torch.full((self.EOS_SLOTS,), -1, dtype=torch.int64, device=device)
        self.pad = torch.zeros((), dtype=torch.int64, device=device)

    def start(self, eos: Sequence[int], pad: int) -> bool:
        """Ready for a generation ending at `eos`; False when there are too many ids to hold."""
        if len(eos) > self.EOS_SLOTS:
            return False
        self.unfinished.fill_(True)
        self.eos.fill_(-1)  # never a token id
        self.eos[: len(eos)] = torch.tensor(list(eos), dtype=torch.int64)
        self.pad.fill_(pad)
        return True

    def __call__(self, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        tokens = torch.where(self.unfinished, logits.argmax(dim=-1), self.pad)
        self.unfinished &= ~(tokens[:, None] == self.eos).any(dim=-1)
        self.tokens.copy_(tokens)
        ids.copy_(tokens[:, None])
        return self.tokens


class Decoder:
    """The decode steps of one generation: `step(tokens)` feeds the tokens and returns the step's
    logits [B, vocab]. With a DecodeGraph, `pick` is its captured GreedyPick: then `replay()`
    runs a step on the tokens the previous one picked and leaves the next in `pick.tokens`."""

    def __init__(self, step: Callable[[torch.Tensor], Any], graph: Any = None):
        self.step, self._graph = step, graph
        self.pick: GreedyPick | None = graph.pick if graph else None

    def pick_first(self, logits: torch.Tensor) -> None:
        """The tokens the prefill's logits give, picked into the first replay's ids buffer."""
        assert self.pick is not None
        self.pick(logits, self._graph._step.ids)

    def replay(self) -> None:
        self._graph()


def decoder(package: Package, first: Sequence[torch.Tensor]) -> Decoder:
    """tokens [B] -> logits [B, vocab] of the step that feeds them, starting from the inputs of
    the first decode step `first` and the cache the prefill left in the package's state. On CUDA
    with CUDA graphs (reduce-overhead), each step is one replay of the package's DecodeGraph (made
    at the first generate, kept for the next); otherwise a call of the package."""
    graphs = package.manifest.runtime.cuda_graphs and package.device.type == "cuda"
    graph = package._decode_graph if graphs else None
    if graphs and graph is None:
        from .cuda_graphs import DecodeGraph

        step = DecodeStep(first)
        pick = GreedyPick(first[0].shape[0], package.device)
        try:
            with package.run_settings():
                graph = DecodeGraph(
                    package._run_loader, package.device, step, package._state,
                    package._n_outputs, pick, package.signature.state_in_place,
                )  # fmt: skip
        except Exception as exc:  # capture is an optimisation: never fail the call because of it
            print(
                f"aotc_runtime: CUDA-graph capture of the decode step failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); decoding without graphs",
                file=sys.stderr,
            )
            torch.cuda.synchronize(package.device)
            package._decode_graph = False  # this load decodes without graphs from now on
            graph = None
        else:
            package._decode_graph = graph
    if graph:
        graph._step.load(first)
        graph.load_state(package._state)
        package._state = graph.state  # what a later call of the package continues from

        def replay(tokens: torch.Tensor) -> torch.Tensor:
            # no run_settings: TF32 and cuDNN flags choose kernels at capture, a replay reads none
            graph._step.ids.copy_(tokens[:, None])
            return graph()

        return Decoder(replay, graph)
    step = DecodeStep(first)

    def call(tokens: torch.Tensor) -> torch.Tensor:
        step.ids.copy_(tokens[:, None])
        logits = package(*step.inputs)
        step.advance()
        return logits

    return Decoder(call)


class HostCopy:
    """A step's new tokens on the host, copied while the device runs the next step: the copy is
    queued before the next step and waited for after it is queued (on CUDA, into pinned memory)."""

    def __init__(self, like: torch.Tensor):
        self._cuda = like.device.type == "cuda"
        self._buffer = torch.empty_like(like, device="cpu", pin_memory=self._cuda)
        self._done = torch.cuda.Event() if self._cuda else None

    def start(self, tokens: torch.Tensor) -> None:
        self._buffer.copy_(tokens, non_blocking=self._cuda)
        if self._done is not None:
            self._done.record()

    def result(self) -> torch.Tensor:
        if self._done is not None:
            self._done.synchronize()
        return self._buffer.clone()


def stream(
    package: Package,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    eos_token_ids: Sequence[int] | None = None,
) -> Iterator[torch.Tensor]:
    """Yields each step's new tokens [prompts] (on the CPU) as they come. At most the
    package's batch of prompts; fewer are answered as if the others were not there.

    The host waits for one thing per token, the copy of its tokens, and on CUDA by then the device
    already has the next step: a step is queued (its input is the sampled tokens, still on the
    device) before the previous one's tokens are read. A generation on CUDA that ends at an
    end-of-sequence token has queued one step it does not use."""
    generation = generation_of(package)
    check_request(generation, input_ids, attention_mask, max_new_tokens, sampling)
    prompts, length = input_ids.shape
    device, batch = package.device, generation.batch_size
    ids = input_ids.to(device, torch.int64)
    mask = (
        torch.ones_like(ids) if attention_mask is None else attention_mask.to(device, torch.int64)
    )
    if prompts < batch:  # the package's batch is fixed: the other rows are fed nothing
        filler = torch.zeros(batch - prompts, length, dtype=torch.int64, device=device)
        ids, mask = torch.cat([ids, filler]), torch.cat([mask, filler])
    eos_list, pad = feedback_ids(generation, eos_token_ids)
    eos = torch.tensor(eos_list, dtype=torch.int64, device=device)
    eos_host = torch.tensor(eos_list, dtype=torch.int64)
    # each prompt's row draws from a generator of its own, seeded alike: a prompt's sampled
    # tokens are the same alone, beside others, or in a served running batch
    picker = RowPicker(batch, device)
    for row in range(prompts):
        picker.set(row, sampling)
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)
    finished_host = torch.zeros(batch, dtype=torch.bool)
    with package._generating.generation(), torch.inference_mode():
        package.reset_state()
        prefill = prefill_inputs(ids, mask)
        logits = package.call_without_graphs(*prefill)
        pick = None
        if max_new_tokens > 1:
            # the first decode step's inputs: each prompt's row holds its prompt and is fed one
            # token a step
            fed = (torch.arange(batch, device=device) < prompts).long()
            first = (prefill[0][:, -1:], prefill[2], fed)
            decode = decoder(package, first)
            # greedy on a decode graph: each replay picks the next tokens itself (GreedyPick)
            pick = decode.pick if sampling.greedy else None
            if pick is not None and not pick.start(eos_list, pad):
                pick = None
        host = HostCopy(unfinished.long())
        # On CUDA the next step is queued before the tokens are read, so the device works while
        # the host waits; on the CPU a "queued" step runs there and then, so it comes after.
        overlap = device.type == "cuda"
        for step in range(max_new_tokens):
            last = step + 1 == max_new_tokens
            if pick is not None:
                if step == 0:  # the prefill's logits, picked outside the graph the same way
                    decode.pick_first(logits)
                host.start(pick.tokens)
                if not last:
                    decode.replay()
            else:
                tokens = picker(logits)
                tokens = torch.where(unfinished, tokens, torch.full_like(tokens, pad))
                if eos.numel():
                    unfinished &= ~torch.isin(tokens, eos)
                host.start(tokens)
                if overlap and not last:
                    logits = decode.step(tokens)
            new = host.result()
            with package._generating.paused():
                yield new[:prompts]
            if eos_host.numel():
                finished_host |= torch.isin(new, eos_host)
            if last or bool(finished_host[:prompts].all()):
                return
            if not overlap:
                logits = decode.step(tokens)


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
