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
(one number per token, instead of a generator call per row)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The accepted ranges, the same in the Python API, `aotc generate`, the C++ runner and HTTP
# (docs/reliability.md). Below MIN_TEMPERATURE, logits / temperature overflows float32 for large
# logits and softmax gives NaN (vLLM raises such temperatures to 0.01 for the same reason); below
# MIN_TOP_P the nucleus is one token anyway, and float32 cannot tell the bound from 0.
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0
MIN_TOP_P = 1e-6
MAX_TOP_K = 2**31 - 1
MAX_SEED = 2**64 - 1  # a generator's seed is 64 bits


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_whole_number(value: object) -> bool:
    """An int that is not a bool (JSON and Python both let True pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy (argmax)
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def check(self) -> str | None:
        """Why these settings are not valid, or None: one line naming the value and the range."""
        t = self.temperature
        if not _is_number(t) or not (t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            return (
                f"temperature {t!r} is outside the accepted values: 0 for greedy, or "
                f"{MIN_TEMPERATURE} to {MAX_TEMPERATURE:g} to sample"
            )
        if self.top_k is not None and not (
            is_whole_number(self.top_k) and 1 <= self.top_k <= MAX_TOP_K
        ):
            return f"top-k {self.top_k!r} is not a whole number from 1 to {MAX_TOP_K}"
        p = self.top_p
        if p is not None and not (_is_number(p) and MIN_TOP_P <= p <= 1.0):
            return f"top-p {p!r} is outside [{MIN_TOP_P:g}, 1]"
        if self.seed is not None and not (
            is_whole_number(self.seed) and 0 <= self.seed <= MAX_SEED
        ):
            return f"seed {self.seed!r} is not a whole number from 0 to 2**64-1"
        return None


GREEDY = Sampling()


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


class RowSampler:
    """The next token of every row of a batch from its logits [B, vocab], on the device, each row
    by its own Sampling (see the module's text). Its settings live in device buffers written at
    `set`, so a CUDA graph that captured a call replays it for whatever rows run now; a call's
    work depends only on `mode`, the least work the rows' settings need (argmax; softmax and a
    running sum; or a sort for top-k and top-p too), so a graph is captured per mode."""

    def __init__(self, rows: int, vocab: int, device: torch.device):
        self.rows, self.vocab, self.device = rows, vocab, device
        self.settings: list[Sampling] = [GREEDY] * rows
        self.greedy = torch.ones(rows, dtype=torch.bool, device=device)
        # 1 where greedy: no division by 0
        self.temperature = torch.ones(rows, dtype=torch.float32, device=device)
        self.top_k = torch.full((rows,), vocab, dtype=torch.int64, device=device)
        self.top_p = torch.ones(rows, dtype=torch.float32, device=device)
        self.seed = torch.zeros(rows, dtype=torch.int64, device=device)
        self.drawn = torch.zeros(rows, dtype=torch.int64, device=device)  # tokens each row made
        self.tokens = torch.zeros(rows, dtype=torch.int64, device=device)  # the last choice
        self._positions = torch.arange(vocab, device=device)

    def set(self, row: int, sampling: Sampling) -> None:
        """Row `row` picks by `sampling` from its next token on, its count of draws from 0 (the
        seed is 0 when none is given, as `generate`'s)."""
        self.settings[row] = sampling
        greedy = sampling.greedy
        self.greedy[row] = greedy
        self.temperature[row] = 1.0 if greedy else float(sampling.temperature)
        top_k = sampling.top_k
        self.top_k[row] = self.vocab if top_k is None or greedy else min(top_k, self.vocab)
        self.top_p[row] = 1.0 if sampling.top_p is None or greedy else float(sampling.top_p)
        self.seed[row] = _signed(sampling.seed or 0)
        self.drawn[row] = 0

    @property
    def mode(self) -> str:
        sampled = [s for s in self.settings if not s.greedy]
        if not sampled:
            return GREEDY_ONLY
        filtered = any(
            (s.top_k is not None and s.top_k < self.vocab) or (s.top_p is not None and s.top_p < 1)
            for s in sampled
        )
        return FILTERED if filtered else SAMPLED

    def __call__(
        self,
        logits: torch.Tensor,
        drawing: torch.Tensor | None = None,
        mode: str | None = None,
    ) -> torch.Tensor:
        """[B] tokens from [B, vocab] logits into `tokens` (returned). `drawing` [B] (0/1 or bool)
        marks the rows whose token counts (a row still being fed its prompt makes none); every
        row when None. `mode` is fixed by a graph's capture; `self.mode` otherwise."""
        tokens = self.choose(logits, self.mode if mode is None else mode)
        self.drawn += 1 if drawing is None else drawing.to(torch.int64)
        self.tokens.copy_(tokens)
        return self.tokens

    def choose(self, logits: torch.Tensor, mode: str) -> torch.Tensor:
        """The tokens, changing nothing (a graph's warm-up runs it)."""
        tokens = logits.argmax(dim=-1)
        if mode == GREEDY_ONLY:
            return tokens
        scores = logits.float() / self.temperature[:, None]
        if mode == FILTERED:
            scores = self._filtered(scores)
        running = scores.softmax(dim=-1).cumsum(dim=-1)
        total = running[:, -1:]
        # below the total, which rounding of the product could reach: the first running sum
        # above the target then belongs to a token with some probability
        below = torch.nextafter(total, torch.zeros_like(total))
        target = torch.minimum(uniforms(self.seed, self.drawn)[:, None] * total, below)
        picked = torch.searchsorted(running, target, right=True).squeeze(1)
        return torch.where(self.greedy, tokens, picked)

    def _filtered(self, scores: torch.Tensor) -> torch.Tensor:
        """`scores` with the tokens outside each row's top-k and then its top-p at -inf: the kept
        tokens are a prefix of the row sorted, so one threshold per row keeps them. A row with
        neither keeps its scores unchanged, so its tokens are the same in every mode."""
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
        threshold = ordered.gather(1, kept - 1)
        return scores.masked_fill(scores < threshold, float("-inf"))
