"""Continuous batching over a text-generation package: sequences join a running batch and leave
it at step boundaries, each answered as if alone (what `aotc serve` runs). Each row picks its
tokens by its own settings, greedy or sampled from a generator of its own (sampling.RowPicker), so
greedy and sampled sequences share the batch and a seeded one's tokens do not depend on its
neighbours.

The package's program (aotc/export/row_cache.py) gives every row of its KV cache a timeline of its
own: a step tells each row how many tokens it holds and feeds it the last few of its window. So a
row is a slot a sequence owns from its join to its leave:

- A decode step feeds every running row its last token.
- A join feeds the joining rows their prompts in chunks of at most `prefill_chunk` tokens, one
  chunk a step, while the same step feeds every running row its next token: a long prompt joins
  without stalling the batch, and a join costs the running rows no step.
- A sequence joins whenever a row is free and its prompt and new tokens fit a row's cache.

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
    prompt: Sequence[int] = ()  # tokens still to feed before the row's first token


class RunningBatch:
    """Generation for up to the package's batch of sequences at once, joining and leaving
    between steps (see above). The package is held (no `generate` on it) from the first join until
    the last row leaves. One thread uses it at a time."""

    def __init__(self, package: Package, overlap: bool | None = None, prefill_chunk: int = 256):
        generation = generation_of(package)
        self.package, self.device = package, package.device
        self.size, self.max_len = generation.batch_size, generation.max_seq_len
        self.prefill_chunk = prefill_chunk
        self.rows: list[_Row | None] = [None] * self.size
        self.held = torch.zeros(self.size, dtype=torch.int64)  # tokens each row's cache holds
        self.last = torch.zeros(self.size, dtype=torch.int64)  # each row's token to feed next
        self._decoder: Any = None  # the decode step, set up again after each join or leave
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
        """Whether a sequence can join at the next step: a free row, and a row's cache holds it."""
        return None in self.rows and prompt_length + max_new_tokens <= self.max_len

    def join(
        self,
        key: Hashable,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: Sampling = GREEDY,
    ) -> None:
        """Queue a sequence for the next step (check `fits` first), its tokens picked by
        `sampling` (a seeded generator of its own when sampled)."""
        if not self.fits(len(prompt), max_new_tokens) or not prompt:
            raise ValueError("the sequence does not fit the running batch; check fits() first")
        if self.active == 0 and not self._held:
            self.package._generating.acquire()
            self._held = True
        slot = self.rows.index(None)
        self.rows[slot] = _Row(key, max_new_tokens, list(prompt))
        self.held[slot] = 0
        self.picker.set(slot, sampling)

    def leave(self, key: Hashable) -> None:
        """The sequence's row is free from the next step (finished, or its client left)."""
        for slot, row in enumerate(self.rows):
            if row is not None and row.key == key:
                self.rows[slot] = None
                self.picker.set(slot, GREEDY)  # a free row draws from no generator
                self._decoder = None  # the row is fed nothing from now on
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
        queued by the previous call, or else a step that feeds the joining sequences a chunk of
        their prompts, or else a decode step. With overlap, the next decode step is queued before
        the tokens are read."""
        if self.active == 0:
            return []
        with torch.inference_mode():
            if self._ahead is not None:
                keys, picked = self._ahead
                self._ahead = None
            else:
                keys = self._keys()
                if any(row is not None and row.prompt for row in self.rows):
                    keys, picked = self._join()
                else:
                    picked = self._decode(self.last.to(self.device))
            self._host.start(picked)
            if self.overlap and self._worth_a_step_ahead(keys):
                self._ahead = (self._keys(), self._decode(picked))
            tokens = self._host.result()
        made = []
        for slot, (key, token) in enumerate(zip(keys, tokens.tolist())):
            row = self.rows[slot]
            # a row that left since the step was queued, or is still being fed its prompt
            if key is not None and row is not None and row.key == key and not row.prompt:
                self.last[slot] = token
                row.left -= 1
                made.append((key, token))
        return made

    def _keys(self) -> list:
        return [row.key if row is not None else None for row in self.rows]

    def _worth_a_step_ahead(self, keys: list) -> bool:
        """No sequence waits to join, and a row of this step has tokens to make after it (which
        also keeps the step inside the row's cache: `fits` counted those tokens)."""
        if any(row is not None and row.prompt for row in self.rows):
            return False
        return any(
            row is not None and row.key == key and row.left > 1 for row, key in zip(self.rows, keys)
        )

    def _join(self) -> tuple[list, torch.Tensor]:
        """A step that feeds each joining row the next chunk of its prompt and each running row
        its last token; (the keys of the rows that made a token, the tokens)."""
        chunks = {
            slot: row.prompt[: self.prefill_chunk]
            for slot, row in enumerate(self.rows)
            if row is not None and row.prompt
        }
        window = max(len(chunk) for chunk in chunks.values())
        ids = torch.zeros(self.size, window, dtype=torch.int64)
        fed = torch.zeros(self.size, dtype=torch.int64)
        keys: list = [None] * self.size
        for slot, row in enumerate(self.rows):
            if row is None:
                continue
            chunk = chunks.get(slot)
            if chunk is not None:  # the chunk at the window's end (the step reads it from there)
                ids[slot, window - len(chunk) :] = torch.tensor(list(chunk), dtype=torch.int64)
                fed[slot] = len(chunk)
                row.prompt = row.prompt[len(chunk) :]
            else:
                ids[slot, -1] = self.last[slot]
                fed[slot] = 1
            if not row.prompt:  # a running row, or one whose prompt is all in now: it has a token
                keys[slot] = row.key
        inputs = [t.to(self.device) for t in (ids, self.held, fed)]
        logits = self.package.call_without_graphs(*inputs)
        self.held += fed
        self._decoder = None
        return keys, self.picker(logits)

    def _decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Queues the decode step that feeds `tokens` [B] (on the device) to every running row;
        returns the buffer its tokens will be in."""
        fed = torch.tensor([row is not None for row in self.rows], dtype=torch.int64)
        if self._decoder is None:  # the decode step's buffers from here (decoder() advances them)
            first = [tokens[:, None], self.held.to(self.device), fed.to(self.device)]
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
        self.held += fed  # what the step's own advance does to its buffers, mirrored here
        return picked
