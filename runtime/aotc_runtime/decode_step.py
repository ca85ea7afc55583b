"""A generation step's inputs (the package's program, aotc/export/row_cache.py):

    step(input_ids [T], rows [T], positions [T], picks [R]) -> logits [R, vocab]

token t fed to cache row rows[t] at position positions[t], a row's tokens at consecutive positions
and one after another in the list, the logits those of tokens picks[r]. A token at position
max_seq_len (or past it) is no row's: written where nothing reads, it reads nothing.

`pack` makes a step's inputs from what each row is fed (`pack_lists` the same as lists);
`DecodeStep` holds a decode step's inputs as buffers on the device, shared by the decode engine
(decode_engine.py) and the CUDA graph that replays the step (cuda_graphs.DecodeGraph)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

Feeds = Sequence[tuple[int, int, Sequence[int]]]  # (row, tokens the row holds, tokens to feed)


def pack(feeds: Feeds, picks: int | None = None) -> list:
    """The step's inputs [ids, rows, positions, picks] (int64, on the CPU) that feed each
    (row, tokens the row holds, tokens) of `feeds` its tokens from that position, and pick the
    logits of each feed's last token, in the order of `feeds`. `picks`: the number of picks the
    package takes when it is fixed (its batch), the first feed's last token repeated to fill."""
    ids, rows, positions, chosen = pack_lists(feeds)
    if picks is not None:
        chosen = (chosen + [chosen[0]] * picks)[:picks]
    return [torch.tensor(values, dtype=torch.int64) for values in (ids, rows, positions, chosen)]


def pack_lists(feeds: Feeds) -> tuple[list[int], list[int], list[int], list[int]]:
    """`pack`'s ids, rows, positions and picks (one per feed) as lists, for a caller that lays
    them out itself (cuda_graphs.DecodeGraph.join)."""
    ids: list[int] = []
    rows: list[int] = []
    positions: list[int] = []
    chosen: list[int] = []
    for row, held, tokens in feeds:
        ids.extend(tokens)
        rows.extend([row] * len(tokens))
        positions.extend(range(held, held + len(tokens)))
        chosen.append(len(ids) - 1)
    return ids, rows, positions, chosen


class DecodeStep:
    """A decode step's inputs as buffers on the device, one token per row of the batch: ids [B],
    rows 0..B-1, positions [B] (each fed row's count of held tokens, max_seq_len for a row fed
    nothing), picks 0..B-1; and `fed` [B] (1 for a row decoding, 0 for none). `advance` leaves each
    fed row one position further, so no host value crosses to the device per token."""

    def __init__(self, batch: int, max_len: int, device: torch.device):
        self.max_len = max_len
        every = torch.arange(batch, dtype=torch.int64, device=device)
        self.ids = torch.zeros(batch, dtype=torch.int64, device=device)
        self.positions = torch.full((batch,), max_len, dtype=torch.int64, device=device)
        self.fed = torch.zeros(batch, dtype=torch.int64, device=device)
        self.inputs = [self.ids, every, self.positions, every.clone()]

    def advance(self) -> None:
        self.positions.add_(self.fed)

    def load(self, tokens: torch.Tensor, held: torch.Tensor, fed: torch.Tensor) -> None:
        """Each row's token of `tokens` [B] (on the device) at its count of `held` tokens [B], for
        the rows `fed` [B] marks 1; the others fed nothing."""
        self.ids.copy_(tokens)
        self.fed.copy_(fed)
        unfed = torch.full_like(held, self.max_len)
        self.positions.copy_(torch.where(fed > 0, held, unfed))
