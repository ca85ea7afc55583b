"""The next token of each sequence from its logits, on the logits' device: greedy, or sampled with
temperature, top-k and top-p (nucleus). The order of the filters is transformers' (temperature,
then top-k, then top-p), so a seeded run picks from the same distribution `generate` would."""

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


def next_tokens(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
) -> torch.Tensor:
    """[B] token ids from [B, vocab] logits."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    scores = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True, dim=-1)
        probabilities = ordered.softmax(dim=-1)
        # drop a token once the ones before it already hold top_p; the first always stays
        drop = (probabilities.cumsum(dim=-1) - probabilities) >= sampling.top_p
        drop[..., 0] = False  # even where top_p rounds to 0 in float32
        scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    probabilities = scores.softmax(dim=-1)
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(-1)


GREEDY = Sampling()


class RowPicker:
    """The next token of every row of a batch, each row by its own settings and its own generator:
    greedy and sampled rows share a batch, and a seeded row's tokens are the same whatever its
    neighbours (vLLM's sampler keeps a generator per seeded request the same way). A row's
    generator draws once per token of that row, nothing else draws from it."""

    def __init__(self, rows: int, device: torch.device):
        self.device = device
        self.settings: list[Sampling] = [GREEDY] * rows
        self.generators: list[torch.Generator | None] = [None] * rows

    def set(self, row: int, sampling: Sampling) -> None:
        """Row `row` picks by `sampling` from now on (a seeded generator of its own: seed 0 when
        none is given, as `generate` does)."""
        self.settings[row] = sampling
        self.generators[row] = None
        if not sampling.greedy:
            generator = torch.Generator(self.device)
            generator.manual_seed(0 if sampling.seed is None else sampling.seed)
            self.generators[row] = generator

    @property
    def all_greedy(self) -> bool:
        return all(s.greedy for s in self.settings)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """[B] tokens from [B, vocab] logits, on the logits' device (no host round trip)."""
        tokens = logits.argmax(dim=-1)
        for row, (sampling, generator) in enumerate(zip(self.settings, self.generators)):
            if generator is not None:
                tokens[row] = next_tokens(logits[row : row + 1], sampling, generator)[0]
        return tokens
