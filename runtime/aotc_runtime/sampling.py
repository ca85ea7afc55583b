"""The next token of each sequence from its logits, on the logits' device: greedy, or sampled with
temperature, top-k and top-p (nucleus). The order of the filters is transformers' (temperature,
then top-k, then top-p), so a run picks from the distribution `generate` would.

`RowSampler` picks for a whole batch in one set of tensor operations, each row by its own settings:
greedy and sampled rows share a batch, and a CUDA graph captures the choice with the decode step.
Its random numbers are counter-based (as Philox is in JAX and in Triton's `tl.rand`): row b's i-th
token draws one uniform number from a hash of (its seed, i), nothing else. So a seeded row's tokens
do not depend on its neighbours, on how many steps its prompt took, or on which front end runs it,
and the C++ runner (runtime/cpp/src/sampling.cpp) computes the same numbers with the same
operations. The draw is inverse-CDF: the first token whose running probability passes the number
(one number per token, instead of a generator call per row).

Before temperature, a row's penalties change its logits (transformers applies its logits
processors before its warpers, and vLLM its penalties before temperature): the repetition penalty
as transformers' `RepetitionPenaltyLogitsProcessor` (a logit of a token in the prompt or made so
far divided by it, or multiplied when negative), then the presence and frequency penalties as
OpenAI and vLLM define them over the tokens made (logit - presence * (count > 0) - frequency *
count). After top-p, min-p as transformers' `MinPLogitsWarper` (drop the tokens whose probability
is below min_p times the most likely one's). Greedy rows take the argmax of the penalized logits,
as `generate` does. Log-probabilities, for the rows that ask, are the log-softmax of the raw
logits (before penalties and temperature, as vLLM returns them by default).

A row held to a grammar (token_grammar.py) has its logits outside its mask set to -inf before
everything else, so its penalties, temperature and filters work on the allowed tokens only, and
greedy, sampled and constrained rows share one batch.

A row whose logits are not finite (a NaN, a +inf, or nothing but -inf: a NaN weight, an fp16
overflow) has no distribution to pick from; inverse-CDF over NaN would return the vocabulary's
size, an id the model's embedding cannot take on the next step. Such a row picks token 0 and is
marked in `failed`, for the engine to end it alone; every id the sampler returns is inside the
vocabulary."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# the settings and their ranges live without torch (sampling_settings.py); here for the sampler
# and for the names imported from this module
from .sampling_settings import (  # noqa: F401
    GREEDY,
    MAX_LOGPROBS,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
    MAX_SEED,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    MIN_REPETITION_PENALTY,
    MIN_TEMPERATURE,
    MIN_TOP_P,
    Sampling,
    is_whole_number,
)


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 that holds it."""
    return value - 2**64 if value >= 2**63 else value


# splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014)
_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical shift of int64 lanes (torch shifts signed integers arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One number in [0, 1) per row, float32 multiples of 2**-24: splitmix64 of (seed, counter)'s
    64 bits (int64 multiplication wraps, as the hash wants), its top 24 bits."""
    z = seeds + (counters + 1) * _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    z = z ^ _shift_right(z, 31)
    return _shift_right(z, 40).to(torch.float32) * 2.0**-24


GREEDY_ONLY, SAMPLED, FILTERED = "greedy", "sampled", "filtered"
MODES = (GREEDY_ONLY, SAMPLED, FILTERED)
# The work a mode adds to its base when a row asks for it, each named after "+" in the mode
# ("filtered+penalties+logprobs"): a batch that asks for none of it does none of it. MASKED: a row
# held to a grammar picks only among the tokens its mask allows (token_grammar.py).
PENALTIES, LOGPROBS, MASKED = "penalties", "logprobs", "masked"


def sampler_mode(
    base: str, penalties: bool = False, logprobs: bool = False, masked: bool = False
) -> str:
    """The name of a sampler's mode: its base (GREEDY_ONLY, SAMPLED, FILTERED) and its extras."""
    return "+".join([base] + [PENALTIES] * penalties + [LOGPROBS] * logprobs + [MASKED] * masked)


# The least logits a part of a row holds in `largest`'s first stage: enough that each of its
# programs streams a few KB, few enough parts that the second stage is one small reduction
MIN_PART = 1024


def parts_of(vocab: int) -> int:
    """How many equal parts `largest` splits a row of `vocab` logits into: the most that divide it
    evenly (a view, no copy) and leave each at least MIN_PART; 1 when none does."""
    return next((n for n in range(vocab // MIN_PART, 1, -1) if vocab % n == 0), 1)


def largest(logits: torch.Tensor, parts: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] values, [B] ids) of each row's largest logit of [B, vocab], the first id among equals,
    a NaN counting as largest (as `torch.max` over a dim). On CUDA in two stages, as
    flash-decoding splits its softmax: the largest of each of `parts` parts of the row
    (`parts_of`), then of the parts; the first part holding the largest value wins, and holds its
    first id. One reduction over a long row keeps few programs busy: on an H200 at batch 1 the
    Llama-3 vocabulary took 37 µs that way and 23 µs in parts (scripts/greedy_pick.py,
    docs/benchmarks.md). On the CPU one reduction is faster (`parts` 1)."""
    rows, vocab = logits.shape
    if parts is None:
        parts = parts_of(vocab) if logits.device.type == "cuda" else 1
    if parts == 1:
        values, ids = logits.max(dim=-1)
        return values, ids
    span = vocab // parts
    part_values, part_ids = logits.reshape(rows, parts, span).max(dim=-1)
    values, part = part_values.max(dim=-1)
    return values, part * span + part_ids.gather(1, part[:, None]).squeeze(1)


def greedy_pick(
    logits: torch.Tensor, parts: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] tokens, [B] failed) of [B, vocab] logits in one search (`largest`): each row's first
    largest id, and whether its largest logit is not finite (a NaN or +inf in the row, or nothing
    but -inf: `largest` counts a NaN as largest); a failed row's token is 0."""
    values, ids = largest(logits, parts)
    failed = ~values.isfinite()
    return ids.masked_fill(failed, 0), failed


def _extras(mode: str) -> tuple[str, bool, bool, bool]:
    """(base, penalties, logprobs, masked) of a mode's name."""
    base, *extras = mode.split("+")
    return base, PENALTIES in extras, LOGPROBS in extras, MASKED in extras


def allowed_tokens(mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] bool of [B, words] int32 bit masks (bit t % 32 of word t // 32: token t is
    allowed; token_grammar.py's format)."""
    shifts = torch.arange(32, dtype=torch.int32, device=mask.device)
    bits = (mask[:, :, None] >> shifts) & 1
    return bits.reshape(mask.shape[0], -1)[:, :vocab].bool()


class RowSampler:
    """The next token of every row of a batch from its logits [B, vocab], on the device, each row
    by its own Sampling (see the module's text). Its settings live in device buffers written at
    `set`, so a CUDA graph that captured a call replays it for whatever rows run now; a call's
    work depends only on `mode`, the least work the rows' settings need (argmax; softmax and a
    running sum; or a sort for top-k, top-p and min-p too; plus penalties, plus log-probabilities,
    only while a row asks for them), so a graph is captured per mode."""

    def __init__(self, rows: int, vocab: int, device: torch.device):
        self.rows, self.vocab, self.device = rows, vocab, device
        self.settings: list[Sampling] = [GREEDY] * rows
        self.logprobs_wanted: list[int | None] = [None] * rows  # each row's top count, or None
        self.masked_rows: list[bool] = [False] * rows  # the rows held to a grammar
        self.greedy = torch.ones(rows, dtype=torch.bool, device=device)
        # 1 where greedy: no division by 0
        self.temperature = torch.ones(rows, dtype=torch.float32, device=device)
        self.top_k = torch.full((rows,), vocab, dtype=torch.int64, device=device)
        self.top_p = torch.ones(rows, dtype=torch.float32, device=device)
        self.min_p = torch.zeros(rows, dtype=torch.float32, device=device)
        self.seed = torch.zeros(rows, dtype=torch.int64, device=device)
        # the penalties (0, 0, 1 where none: a row without them keeps its logits exactly)
        self.presence = torch.zeros(rows, dtype=torch.float32, device=device)
        self.frequency = torch.zeros(rows, dtype=torch.float32, device=device)
        self.repetition = torch.ones(rows, dtype=torch.float32, device=device)
        # [rows, vocab]: how often each row made each token, and the tokens of its prompt; made at
        # the first penalized row and kept (a graph captured after holds them)
        self.counts: torch.Tensor | None = None
        self.in_prompt: torch.Tensor | None = None
        # [rows, words] int32: the tokens each row may pick (token_grammar.py's bits), written by
        # the engine before each step; made at the first masked row and kept, every bit set for
        # the rows without a grammar
        self.allowed: torch.Tensor | None = None
        self.drawn = torch.zeros(rows, dtype=torch.int64, device=device)  # tokens each row made
        self.tokens = torch.zeros(rows, dtype=torch.int64, device=device)  # the last choice
        # the last choice's rows whose logits were not finite (their token is 0, not a pick)
        self.failed = torch.zeros(rows, dtype=torch.bool, device=device)
        # the last choice's log-probabilities: the chosen token's, and the most likely tokens'
        width = min(MAX_LOGPROBS, vocab)
        self.logprob = torch.zeros(rows, dtype=torch.float32, device=device)
        self.top_logprobs = torch.zeros(rows, width, dtype=torch.float32, device=device)
        self.top_ids = torch.zeros(rows, width, dtype=torch.int64, device=device)
        self._positions = torch.arange(vocab, device=device)
        self._ones = torch.ones(rows, 1, dtype=torch.float32, device=device)
        self._mode = GREEDY_ONLY

    def set(
        self,
        row: int,
        sampling: Sampling,
        prompt: Sequence[int] = (),
        logprobs: int | None = None,
        masked: bool = False,
    ) -> None:
        """Row `row` picks by `sampling` from its next token on, its count of draws from 0 (the
        seed is 0 when none is given, as `generate`'s). `prompt` is what the repetition penalty
        counts besides the tokens made; `logprobs` (a count, 0 for the chosen token's only) asks
        for the log-probabilities of its tokens; `masked`: only the tokens its row of `allowed`
        allows (every token until the caller writes the row)."""
        self.settings[row] = sampling
        self.logprobs_wanted[row] = logprobs
        self.masked_rows[row] = masked
        if masked or self.allowed is not None:
            self.allowed_buffer()[row].fill_(-1)
        greedy = sampling.greedy
        self.greedy[row] = greedy
        self.temperature[row] = 1.0 if greedy else float(sampling.temperature)
        top_k = sampling.top_k
        self.top_k[row] = self.vocab if top_k is None or greedy else min(top_k, self.vocab)
        self.top_p[row] = 1.0 if sampling.top_p is None or greedy else float(sampling.top_p)
        self.min_p[row] = 0.0 if greedy else float(sampling.min_p or 0.0)
        self.seed[row] = _signed(sampling.seed or 0)
        self.drawn[row] = 0
        self.presence[row] = float(sampling.presence_penalty)
        self.frequency[row] = float(sampling.frequency_penalty)
        self.repetition[row] = float(sampling.repetition_penalty)
        if sampling.penalized:  # another row's counts are multiplied by 0 and never read
            counts, in_prompt = self._penalty_buffers()
            counts[row].zero_()
            in_prompt[row].zero_()
            if prompt:
                ids = torch.tensor(list(prompt), dtype=torch.int64).to(self.device)
                in_prompt[row, ids] = True
        self._mode = self._mode_of_settings()

    @property
    def mode(self) -> str:
        return self._mode

    def _mode_of_settings(self) -> str:
        sampled = [s for s in self.settings if not s.greedy]
        if not sampled:
            base = GREEDY_ONLY
        else:
            base = FILTERED if any(s.filtered(self.vocab) for s in sampled) else SAMPLED
        return sampler_mode(
            base,
            penalties=any(s.penalized for s in self.settings),
            logprobs=any(k is not None for k in self.logprobs_wanted),
            masked=any(self.masked_rows),
        )

    def allowed_buffer(self) -> torch.Tensor:
        """`allowed`, made (every token allowed) at its first use."""
        if self.allowed is None:
            words = (self.vocab + 31) // 32
            self.allowed = torch.full((self.rows, words), -1, dtype=torch.int32, device=self.device)
        return self.allowed

    def _penalty_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.counts is None or self.in_prompt is None:
            shape = (self.rows, self.vocab)
            self.counts = torch.zeros(shape, dtype=torch.float32, device=self.device)
            self.in_prompt = torch.zeros(shape, dtype=torch.bool, device=self.device)
        return self.counts, self.in_prompt

    def __call__(
        self,
        logits: torch.Tensor,
        drawing: torch.Tensor | None = None,
        mode: str | None = None,
    ) -> torch.Tensor:
        """[B] tokens from [B, vocab] logits into `tokens` (returned); with log-probabilities in
        the mode, theirs into `logprob`, `top_logprobs` and `top_ids`. `drawing` [B] (0/1 or
        bool) marks the rows whose token counts (a row still being fed its prompt makes none);
        every row when None. `mode` is fixed by a graph's capture; `self.mode` otherwise."""
        mode = self.mode if mode is None else mode
        _base, penalties, logprobs, _masked = _extras(mode)
        tokens, failed = self.choose(logits, mode)
        self.failed.copy_(failed)
        if penalties and self.counts is not None:
            made = self._ones if drawing is None else drawing.to(torch.float32)[:, None]
            self.counts.scatter_add_(1, tokens[:, None], made)
        if logprobs:
            chosen, top_values, top_ids = self.logprobs_of(logits, tokens)
            self.logprob.copy_(chosen)
            self.top_logprobs.copy_(top_values)
            self.top_ids.copy_(top_ids)
        self.drawn += 1 if drawing is None else drawing.to(torch.int64)
        self.tokens.copy_(tokens)
        return self.tokens

    def warm_up(self, logits: torch.Tensor, mode: str) -> None:
        """A call's work in `mode`, changing nothing (before a graph captures it)."""
        tokens, _failed = self.choose(logits, mode)
        if LOGPROBS in mode.split("+"):
            self.logprobs_of(logits, tokens)

    def choose(self, logits: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
        """([B] tokens, [B] failed), changing nothing: failed marks the rows whose logits are not
        finite (for a masked row: whose allowed logits are not, or that its grammar allows nothing),
        whose token is 0. The greedy pick and the check are one search over the (penalized,
        masked) vocabulary (`greedy_pick`)."""
        base, penalties, _logprobs, masked = _extras(mode)
        if masked and self.allowed is not None:  # every other token out of each row's reach
            allowed = allowed_tokens(self.allowed, logits.shape[1])
            logits = logits.masked_fill(~allowed, float("-inf"))
        if penalties and self.counts is not None:  # the argmax of the penalized logits
            # a penalty keeps a NaN, an inf and a row of -inf as they are: the check is the same
            logits = self._penalized(logits)
        tokens, failed = greedy_pick(logits)
        if base == GREEDY_ONLY:
            return tokens, failed
        scores = logits.float() / self.temperature[:, None]
        if base == FILTERED:
            scores = self._filtered(scores)
        running = scores.softmax(dim=-1).cumsum(dim=-1)
        total = running[:, -1:]
        # below the total, which rounding of the product could reach: the first running sum
        # above the target then belongs to a token with some probability
        below = torch.nextafter(total, torch.zeros_like(total))
        target = torch.minimum(uniforms(self.seed, self.drawn)[:, None] * total, below)
        picked = torch.searchsorted(running, target, right=True).squeeze(1)
        # inside the vocabulary whatever the sums hold (NaN sums search to the end)
        picked = picked.clamp(max=self.vocab - 1).masked_fill(failed, 0)
        return torch.where(self.greedy, tokens, picked), failed

    def logprobs_of(
        self, logits: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The log-softmax of the raw logits: the chosen tokens' [B], and the most likely
        tokens' values and ids [B, min(MAX_LOGPROBS, vocab)], most likely first."""
        log_probabilities = logits.float().log_softmax(dim=-1)
        top = log_probabilities.topk(self.top_ids.shape[1], dim=-1)
        chosen = log_probabilities.gather(1, tokens[:, None]).squeeze(1)
        return chosen, top.values, top.indices

    def _penalized(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with each row's penalties (the module's text): transformers' repetition
        penalty over the prompt and the tokens made, then OpenAI's presence and frequency
        penalties over the tokens made. A row without penalties keeps its logits exactly (x * 1,
        x / 1 and x - 0 are x)."""
        assert self.counts is not None and self.in_prompt is not None
        scores = logits.float()
        counts = self.counts
        made = counts > 0
        repetition = self.repetition[:, None]
        repeated = torch.where(scores < 0, scores * repetition, scores / repetition)
        scores = torch.where(self.in_prompt | made, repeated, scores)
        return scores - self.frequency[:, None] * counts - self.presence[:, None] * made

    def _filtered(self, scores: torch.Tensor) -> torch.Tensor:
        """`scores` with the tokens outside each row's top-k, then its top-p, then its min-p at
        -inf: the kept tokens are a prefix of the row sorted, so one threshold per row keeps them.
        A row with none of them keeps its scores unchanged, so its tokens are the same in every
        mode."""
        ordered = scores.sort(dim=-1, descending=True).values
        inside_k = self._positions < self.top_k[:, None]
        ordered = ordered.masked_fill(~inside_k, float("-inf"))
        probabilities = ordered.softmax(dim=-1)
        # drop a token once the ones before it already hold top_p; the first always stays, and a
        # row without top-p drops nothing (its running sum can round to 1 before the end)
        drop = (probabilities.cumsum(dim=-1) - probabilities) >= self.top_p[:, None]
        drop &= self.top_p[:, None] < 1
        drop[:, 0] = False
        kept = (inside_k & ~drop).sum(dim=-1, keepdim=True)
        # min-p on what top-k and top-p kept, renormalized (transformers' MinPLogitsWarper comes
        # after them): keep the tokens at least min_p times as likely as the first (a prefix of
        # the sorted row; a row with min-p 0 keeps them all)
        survivors = ordered.masked_fill(self._positions >= kept, float("-inf")).softmax(dim=-1)
        likely = (survivors >= self.min_p[:, None] * survivors[:, :1]).sum(dim=-1, keepdim=True)
        kept = torch.minimum(kept, likely.clamp(min=1))
        threshold = ordered.gather(1, kept - 1)
        return scores.masked_fill(scores < threshold, float("-inf"))
