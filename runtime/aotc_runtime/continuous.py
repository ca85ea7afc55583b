"""Continuous batching over a text-generation package: sequences join a running batch and leave
it at step boundaries, each answered as if alone (what `aotc serve` runs). Each row picks its
tokens by its own settings, greedy or sampled from a generator of its own (sampling.RowPicker), so
greedy and sampled sequences share the batch and a seeded one's tokens do not depend on its
neighbours.

The package's program (aotc/export/text_generation.py) feeds S tokens to every row of its KV cache
at the same cache columns, and each row's attention mask over the cache says which columns are its
own. The rows share one timeline of columns; a sequence owns the columns its tokens went to:

- A decode step feeds every row's last token at the next column.
- A join is one call of S = L columns (L the longest joining prompt). A joining row's prompt goes
  to the last columns of that window, left-padded, its mask cleared of what the row held before. A
  running row feeds its last token at the window's last column and masks the others out: the call
  is its next decode step as well, so a join costs the running rows no step.

A row's tokens keep their own positions (position_ids count its tokens, not columns), so the
columns it skipped are as invisible to it as left padding. This holds for models that attend to
every earlier token; one with a sliding window measures the window in columns, so a sequence joins
those only into an empty batch (`Generation.sliding_window`).

Every step uses up a column of every row, and a join L of them. A sequence joins only when the
columns left hold its prompt and every running row's remaining tokens (`fits`); otherwise it waits
for the batch to empty, when the timeline starts again at column 0.

On CUDA a step works ahead, as `generation.stream` does: the next decode step is queued (its input
is the tokens just picked, still on the device) before the host reads this step's tokens, so the
device is busy while the host delivers them. A sequence that joins meanwhile waits for that step,
and a row's token from it is dropped if the row left.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .generation import HostCopy, decoder, generation_of
from .sampling import GREEDY, RowPicker, Sampling

if TYPE_CHECKING:
    from .package import Package


@dataclass
class _Row:
    key: Hashable
    left: int  # tokens still to make
    prompt: Sequence[int] | None = None  # until its join step has run


class RunningBatch:
    """Generation for up to the package's batch of sequences at once, joining and leaving
    between steps (see above). The package is held (no `generate` on it) from the first join until
    the last row leaves. One thread uses it at a time."""

    def __init__(self, package: Package, overlap: bool | None = None):
        generation = generation_of(package)
        self.package, self.device = package, package.device
        self.size, self.max_len = generation.batch_size, generation.max_seq_len
        # a model with a sliding window (or a package that does not say) takes rows only when empty
        self.mid_batch_joins = generation.sliding_window == 0
        self.rows: list[_Row | None] = [None] * self.size
        self.column = 0  # the next cache column a step writes
        self.mask = torch.zeros(self.size, self.max_len, dtype=torch.int64)
        self.fed = torch.zeros(self.size, dtype=torch.int64)  # tokens each row has fed so far
        self.last = torch.zeros(self.size, dtype=torch.int64)  # each row's token to feed next
        self._decoder: Any = None  # the decode step, set up again after each join
        self._held = False
        # on the CPU a step queued ahead would run there and then, before its tokens are sent
        self.overlap = self.device.type == "cuda" if overlap is None else overlap
        self._host = HostCopy(torch.zeros(self.size, dtype=torch.int64, device=self.device))
        self.picker = RowPicker(self.size, self.device)
        # a decode step queued by the previous call: (the key of each row it runs for, its
        # tokens on the device once it has run)
        self._ahead: tuple[list, torch.Tensor] | None = None

    @property
    def active(self) -> int:
        return sum(row is not None for row in self.rows)

    def fits(self, prompt_length: int, max_new_tokens: int) -> bool:
        """Whether a sequence can join at the next step."""
        if self.active == 0:
            return prompt_length + max_new_tokens <= self.max_len
        if not self.mid_batch_joins or None not in self.rows:
            return False
        joining = [r for r in self.rows if r is not None and r.prompt is not None]
        window = max([prompt_length, *(len(r.prompt) for r in joining)])  # type: ignore[arg-type]
        # after the join step each row still feeds (tokens left - 1) tokens, one column each
        after = max([max_new_tokens, *(r.left for r in self.rows if r is not None)]) - 1
        return self.column + window + after <= self.max_len

    def join(
        self,
        key: Hashable,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: Sampling = GREEDY,
    ) -> None:
        """Queue a sequence for the next step (check `fits` first), its tokens picked by
        `sampling` (a seeded generator of its own when sampled)."""
        if not self.fits(len(prompt), max_new_tokens):
            raise ValueError("the sequence does not fit the running batch; check fits() first")
        if self.active == 0:  # a new timeline
            if not self._held:
                self.package._generating.acquire()
                self._held = True
            self.package.reset_state()
            self.column, self._decoder = 0, None
            self.mask.zero_()
            self.fed.zero_()
        slot = self.rows.index(None)
        self.rows[slot] = _Row(key, max_new_tokens, list(prompt))
        self.picker.set(slot, sampling)

    def leave(self, key: Hashable) -> None:
        """The sequence's row is free from the next step (finished, or its client left)."""
        for slot, row in enumerate(self.rows):
            if row is not None and row.key == key:
                self.rows[slot] = None
                self.picker.set(slot, GREEDY)  # a free row draws from no generator
        if self.active == 0:
            self.release()

    def release(self) -> None:
        """Give the package back (after the last row left, or when a step failed)."""
        self.rows = [None] * self.size
        self._ahead = None  # its tokens are nobody's now
        if self._held:
            self._held = False
            self.package._generating.release()

    def step(self) -> list[tuple[Hashable, int]]:
        """One step's tokens, as (key, token) per row it ran for that is still there: the step
        queued by the previous call, or else a join of the waiting sequences, or else a decode
        step. With overlap, the next decode step is queued before the tokens are read."""
        if self.active == 0:
            return []
        with torch.inference_mode():
            if self._ahead is not None:
                keys, picked = self._ahead
                self._ahead = None
            else:
                keys = self._keys()
                joining = [slot for slot, r in enumerate(self.rows) if r is not None and r.prompt]
                if joining:
                    picked = self.picker(self._join(joining))
                else:
                    picked = self._decode(self.last.to(self.device))
            self._host.start(picked)
            if self.overlap and self._worth_a_step_ahead(keys):
                self._ahead = (self._keys(), self._decode(picked))
            tokens = self._host.result()
        self.last.copy_(tokens)
        made = []
        for slot, (key, token) in enumerate(zip(keys, tokens.tolist())):
            row = self.rows[slot]
            # a row that left since the step was queued, or joined after (its join is to come)
            if key is not None and row is not None and row.key == key and row.prompt is None:
                row.left -= 1
                made.append((key, token))
        return made

    def _keys(self) -> list:
        return [row.key if row is not None else None for row in self.rows]

    def _worth_a_step_ahead(self, keys: list) -> bool:
        """No sequence waits to join, and a row of this step has tokens to make after it (which
        also keeps the step inside the cache: `fits` counted those tokens' columns)."""
        if any(row is not None and row.prompt for row in self.rows):
            return False
        return any(
            row is not None and row.key == key and row.left > 1 for row, key in zip(self.rows, keys)
        )

    def _join(self, joining: list[int]) -> torch.Tensor:
        prompts = {slot: self.rows[slot].prompt for slot in joining}  # type: ignore[union-attr]
        window = max(len(p) for p in prompts.values())  # type: ignore[arg-type]
        start = self.column
        ids = torch.zeros(self.size, window, dtype=torch.int64)
        positions = torch.zeros(self.size, window, dtype=torch.int64)
        for slot in range(self.size):
            prompt = prompts.get(slot)
            if prompt is not None:  # left-padded into the window, nothing of the row before
                first = window - len(prompt)
                ids[slot, first:] = torch.tensor(list(prompt), dtype=torch.int64)
                positions[slot, first:] = torch.arange(len(prompt))
                self.mask[slot] = 0
                self.mask[slot, start + first : start + window] = 1
                self.fed[slot] = len(prompt)
                self.rows[slot].prompt = None  # type: ignore[union-attr]
            else:  # its next decode step, at the window's last column
                ids[slot, -1] = self.last[slot]
                positions[slot] = self.fed[slot]
                self.mask[slot, start : start + window] = 0
                self.mask[slot, start + window - 1] = 1
                self.fed[slot] += 1
        cache_position = torch.arange(start, start + window)
        inputs = [t.to(self.device) for t in (ids, positions, cache_position, self.mask)]
        logits = self.package.call_without_graphs(*inputs)
        self.column = start + window
        self._decoder = None
        return logits

    def _decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Queues the decode step that feeds `tokens` [B] (on the device); returns the buffer its
        tokens will be in."""
        column = self.column
        if self._decoder is None:  # the decode step's buffers from here (decoder() advances them)
            self.mask[:, column] = 1
            first = [
                tokens[:, None],
                self.fed[:, None].to(self.device),
                torch.tensor([column], device=self.device),
                self.mask.to(self.device),
            ]
            self._decoder = decoder(self.package, first)
            if self._decoder.pick is not None:
                self._decoder.pick.start([], 0)  # rows end here, not at an end-of-sequence id
        pick = self._decoder.pick if self.picker.all_greedy else None
        if pick is not None and tokens is pick.tokens:  # the graph wrote them as the step's ids
            self._decoder.replay()
            picked = pick.tokens
        else:
            logits = self._decoder.step(tokens)
            picked = pick.tokens if pick is not None else self.picker(logits)
        # what the step's own advance does to its buffers, mirrored here for the next join
        self.fed += 1
        self.column = column + 1
        if self.column < self.max_len:
            self.mask[:, self.column] = 1
        return picked
