"""The next token of each sequence from its logits, on the logits' device: greedy, or sampled with
temperature, top-k and top-p (nucleus). The order of the filters is transformers' (temperature,
then top-k, then top-p), so a seeded run picks from the same distribution `generate` would."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
        """Why these settings are not valid, or None."""
        if self.temperature < 0:
            return (
                f"temperature {self.temperature} is negative; use 0 for greedy or a positive value"
            )
        if self.top_k is not None and self.top_k < 1:
            return f"top-k {self.top_k} is below 1"
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            return f"top-p {self.top_p} is outside (0, 1]"
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
        scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    probabilities = scores.softmax(dim=-1)
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(-1)
