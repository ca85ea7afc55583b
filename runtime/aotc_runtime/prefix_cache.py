"""Prompt prefixes reused from the package's KV cache: a sequence that joins a decode engine starts
from the longest start of its prompt that a row of the cache already holds, and is fed only the
rest (a chat's next turn, requests that share a system prompt).

Each row of the cache holds, at its positions 0..n-1, the keys and values of the n tokens its
sequence was fed: its prompt and the tokens it made, all but the last. A running row keeps them
while it runs, and a free row until a sequence joins it, so a joining sequence whose prompt starts
with n of them:
- takes that row if it is free (nothing is copied), or
- takes a free row, into which the n positions are copied from the running row that holds them
  (`Package.copy_cache_rows`: one copy per layer's keys and one per its values).

The rows themselves are the store (slot-to-slot copies), not paged blocks with hashed prefixes
(vLLM) or a radix tree over them (SGLang): a package's cache is one contiguous [B, positions,
heads, head dim] tensor per layer, and its compiled attention reads a row's positions in order, so
blocks would need a block table inside the compiled step (another step format, every package
exported again). A copy moves n positions of keys and values, a small fraction of the work of
computing them again (every weight read per chunk, every layer's attention). What it costs is
capacity: the prefixes kept are those of the running rows and of the free rows, at most the batch.
A sequence that finds no prefix to reuse takes a free row that holds nothing, else the free row
used least recently (its prefix is evicted): a step feeds only the rows that hold a sequence, so
which row it is costs nothing.

Nothing else may have moved the cache since the rows' contents were recorded: the package's
generation gate counts who took it (`GenerationGate.turns`), and an engine that takes the package
after anyone else did forgets every row's contents (`claim`). A reused prefix gives a sequence the
tokens it would have had without it: its keys and values were computed from the same tokens at the
same positions (tests/test_prefix_cache.py checks the tokens against the uncached run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# The fewest tokens worth reusing: below this, feeding them again costs about what the copies
# cost (two small copies per layer), and a free row's few tokens are not worth keeping it for
MIN_REUSED = 16


def common_start(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` share from their first."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]: halve the gap
    while high - low > 1:
        middle = (low + high) // 2
        if list(a[low:middle]) == list(b[low:middle]):
            low = middle
        else:
            high = middle
    return low


class PrefixCache:
    """What each free row of one package's KV cache holds, kept across decode engines (a server
    keeps one for its life); a DecodeEngine given it reuses prefixes at `join` (module text)."""

    def __init__(self, min_reused: int = MIN_REUSED):
        if min_reused < 1:
            raise ValueError(f"min_reused must be at least 1 token, not {min_reused}")
        self.min_reused = min_reused
        self.held: dict[int, list[int]] = {}  # free row -> the tokens at its positions 0..n-1
        self._last_used: dict[int, int] = {}  # row -> when its last sequence ended (a clock)
        self._clock = 0
        self._turn: int | None = None  # the gate's turn the last engine with this cache took
        self.reused_tokens = 0  # prompt tokens not fed again, over the cache's life
        self.copied_tokens = 0  # of those, the ones copied from another row

    def claim(self, turns: int) -> None:
        """An engine took the package, the gate's `turns`-th taker: if anyone else took it since
        this cache's last engine, the rows may hold anything: forget them all."""
        if self._turn is None or turns != self._turn + 1:
            self.held.clear()
        self._turn = turns

    def find(self, prompt: Sequence[int], running: Mapping[int, Sequence[int]]) -> tuple:
        """(row, n): the row, free or running (`running`: row -> the tokens it holds), that holds
        the longest start of `prompt`, and that start's length, at most all of the prompt but its
        last token (the step that feeds it makes the first token); (None, 0) below min_reused."""
        best_row, best = None, 0
        for row, tokens in [*self.held.items(), *running.items()]:
            n = min(common_start(prompt, tokens), len(prompt) - 1)
            if n > best or (n == best and n and row in self.held and best_row not in self.held):
                best_row, best = row, n  # on a tie, a free row: nothing to copy
        return (best_row, best) if best >= self.min_reused else (None, 0)

    def row_for(self, free: Sequence[int]) -> int:
        """The free row a sequence takes when no free row holds its prefix: one that holds
        nothing, else the least recently used (a step feeds only the rows that hold a sequence,
        wherever they are, so which one is free costs nothing)."""
        empty = [row for row in free if row not in self.held]
        if empty:
            return min(empty)
        return min(free, key=lambda row: (self._last_used.get(row, -1), row))

    def taken(self, row: int, reused: int, copied: bool) -> None:
        """A sequence joined `row`, reusing `reused` tokens of its prompt (copied from another
        row or not): the row is running, its contents the engine's to tell."""
        self.held.pop(row, None)
        self.reused_tokens += reused
        self.copied_tokens += reused if copied else 0

    def kept(self, row: int, tokens: Sequence[int]) -> None:
        """A sequence left `row` free, its positions 0..len(tokens)-1 holding `tokens`."""
        self._clock += 1
        self._last_used[row] = self._clock
        if len(tokens) >= self.min_reused:
            self.held[row] = list(tokens)
        else:
            self.held.pop(row, None)

    def forget(self, row: int) -> None:
        """What `row` holds is unknown (its sequence failed, or the engine stopped mid-step)."""
        self.held.pop(row, None)
