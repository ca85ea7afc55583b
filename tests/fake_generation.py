"""A text-generation package with no compiled model, for the decode engine's tests
(tests/test_decode_engine_fake.py): `FakeGeneration` is a decode_engine.GeneratingPackage on the
CPU whose step honours the step contract (decode_engine.py, aotc/export/row_cache.py) in plain
Python, so the engine's joins, chunks, finishes and per-row sampling run in milliseconds.

    step(input_ids [T], rows [T], positions [T], picks [R]) -> logits [R, vocab]

Its state is a real per-row cache: the token at each of a row's positions. Token t is written at
row rows[t], position positions[t] (a position at or past the cache's length goes to the padding's
slot, max_seq_len, as the compiled step's does), and the logits of a picked token are those of its
row's whole history up to it, the tokens at positions 0 .. positions[t]: the next token is a hash
of that history mod the vocabulary, with logit LEAD, and every other token a value in [0, 1) drawn
from the same hash, so greedy picks it by a clear margin and a sampled row has a spread to draw
from. A token written at the wrong position, a row fed another row's tokens or a row not emptied
when a sequence joins it gives other tokens than the sequence
alone, which `greedy_alone` computes from the same rule without the engine. With `with_graph`,
its `decode_graph` is an EagerDecodeGraph: the engine's path through cuda_graphs.DecodeGraph.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

import torch

from aotc_runtime.decode_step import DecodeStep
from aotc_runtime.fields import Fields
from aotc_runtime.generation_gate import GenerationGate
from aotc_runtime.generation_record import STEP_FORMAT, Generation, check_generation_record
from aotc_runtime.sampling import RowSampler
from aotc_runtime.signature import Signature

VOCAB = 128
LEAD = 4.0  # the next token's logit; every other token's is below 1
_MASK = 2**64 - 1


class StepContractError(AssertionError):
    """The engine fed the step something the compiled step cannot take (an id outside the
    vocabulary aborts the process there: the embedding's bounds check)."""


def _mix(x: int) -> int:
    """splitmix64's finalizer: 64 bits in, 64 well-mixed bits out."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def history_hash(history: Sequence[int]) -> int:
    """A hash of a row's tokens in order: a token changed, moved, left out or added changes it."""
    h = 0
    for token in history:
        h = _mix(h * 0x9E3779B97F4A7C15 + token + 1)
    return h


def next_token(history: Sequence[int], vocab_size: int = VOCAB) -> int:
    """The token the fake's logits put first after `history`."""
    return history_hash(history) % vocab_size


def logits_of(
    history: Sequence[int],
    vocab_size: int = VOCAB,
    poison: int | None = None,
    poison_value: float = math.nan,
) -> list[float]:
    """The fake's logits after `history`: LEAD for `next_token`, a value in [0, 1) for every other
    token; with `poison` in the history, `poison_value` in place of LEAD (as a NaN embedding row
    reaches every later position through attention)."""
    h = history_hash(history)
    draws = random.Random(h)
    logits = [draws.random() for _ in range(vocab_size)]
    logits[h % vocab_size] = poison_value if poison is not None and poison in history else LEAD
    return logits


def greedy_alone(
    prompt: Sequence[int], new_tokens: int, vocab_size: int = VOCAB, eos: Sequence[int] = ()
) -> list[int]:
    """A sequence's greedy tokens by the fake's rule, alone, in plain Python: up to its first
    end-of-sequence id in `eos`, or `new_tokens` of them."""
    history, made = list(prompt), []
    while len(made) < new_tokens:
        token = next_token(history, vocab_size)
        made.append(token)
        history.append(token)
        if token in eos:
            break
    return made


def log_softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    total = top + math.log(sum(math.exp(x - top) for x in logits))
    return [x - total for x in logits]


def step_signature(
    batch_size: int, max_seq_len: int, vocab_size: int, fewer_picks: bool = True
) -> Signature:
    """The step's signature as aotc export records it (aotc/export/text_generation.py), its state
    one layer's cache [B, max_len + 1, 1, 1] that holds each position's token. `fewer_picks`: the
    step picks R logits (R a dim, as a batch of 3 or more exports); else the batch's B (as a batch
    of 1 or 2)."""
    picks = "R" if fewer_picks else batch_size
    dims = {"T": {"min": 1, "max": batch_size * max_seq_len, "example": 2}}
    if fewer_picks:
        dims["R"] = {"min": 1, "max": batch_size, "example": batch_size}
    return Signature.from_json(
        {
            "inputs": [
                {"name": "input_ids", "dtype": "int64", "shape": ["T"],
                 "value_range": [0, vocab_size - 1]},
                {"name": "rows", "dtype": "int64", "shape": ["T"]},
                {"name": "positions", "dtype": "int64", "shape": ["T"]},
                {"name": "picks", "dtype": "int64", "shape": [picks]},
            ],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [picks, vocab_size]}],
            "dims": dims,
            "output_structure": "tensor",
            "state": [{"name": "token_cache", "dtype": "int64",
                       "shape": [batch_size, max_seq_len + 1, 1, 1]}],
            "state_in_place": True,
        }
    )  # fmt: skip


def generation_record(
    batch_size: int, max_seq_len: int, vocab_size: int, eos_token_ids: Sequence[int] = ()
) -> Generation:
    """The manifest's `generation` record, read as load() reads it."""
    data = {
        "batch_size": batch_size,
        "max_seq_len": max_seq_len,
        "vocab_size": vocab_size,
        "eos_token_ids": list(eos_token_ids),
        "pad_token_id": None,
        "tokenizer": None,
        "sliding_window": 0,
        "step_format": STEP_FORMAT,
    }
    return Generation.read(Fields(data, "generation"))


class FakeGeneration:
    """A GeneratingPackage (decode_engine.py) whose step is the fake's rule above, on the CPU.
    `fed` lists each call's tokens fed to each row of the batch; `past_cache` counts tokens fed at
    or past a row's cache's end (no row's)."""

    def __init__(
        self,
        batch_size: int = 2,
        max_seq_len: int = 32,
        vocab_size: int = VOCAB,
        eos_token_ids: Sequence[int] = (),
        poison: int | None = None,
        poison_value: float = math.nan,
        fewer_picks: bool = True,
        with_graph: bool = False,
    ):
        self.path = Path("fake-generation")
        self.device = torch.device("cpu")
        self.generation_gate = GenerationGate()
        self.signature = step_signature(batch_size, max_seq_len, vocab_size, fewer_picks)
        self.fixed_picks = None if fewer_picks else batch_size
        self._generation = generation_record(batch_size, max_seq_len, vocab_size, eos_token_ids)
        # the record held to the step as load() holds a package's (PackageError if they disagree)
        check_generation_record(self.path, self._generation, self.signature, {})
        self.cache = torch.zeros(batch_size, max_seq_len + 1, 1, 1, dtype=torch.int64)
        self.poison, self.poison_value = poison, poison_value
        self.fed: list[list[int]] = []
        self.copies: list[tuple] = []  # (source, target, positions) of each copy_cache_rows
        self.past_cache = 0
        self.graph = EagerDecodeGraph(self) if with_graph else None

    @property
    def generation(self) -> Generation:
        return self._generation

    def decode_graph(self) -> EagerDecodeGraph | None:
        """None: no CUDA graphs (as a package on the CPU), the engine calls the step itself. With
        `with_graph`, an EagerDecodeGraph: the engine's path through a DecodeGraph, on the CPU."""
        return self.graph

    def copy_cache_rows(self, source: int, target: int, positions: int) -> None:
        self.copies.append((source, target, positions))
        self.cache[target, :positions] = self.cache[source, :positions]

    def call_without_graphs(self, *tensors: torch.Tensor) -> torch.Tensor:
        self.signature.check_inputs(list(tensors))  # as Package.call_without_graphs does
        ids, rows, positions, picks = (t.tolist() for t in tensors)
        self._check(ids, rows, positions, picks)
        length = self._generation.max_seq_len
        fed = [0] * self._generation.batch_size
        for token, row, position in zip(ids, rows, positions):
            if position >= length:  # the padding's slot, never read
                self.past_cache += 1
            else:
                fed[row] += 1
            self.cache[row, min(position, length), 0, 0] = token
        self.fed.append(fed)
        logits = []
        for pick in picks:
            row, position = rows[pick], positions[pick]
            history = self.cache[row, : min(position + 1, length), 0, 0].tolist()
            logits.append(self.logits(history))
        return torch.tensor(logits, dtype=torch.float32)

    def logits(self, history: list[int]) -> list[float]:
        """The logits after a row's `history`: the fake's rule (logits_of); a subclass may say
        other tokens."""
        return logits_of(history, self._generation.vocab_size, self.poison, self.poison_value)

    def _check(self, ids: list, rows: list, positions: list, picks: list) -> None:
        vocab, batch = self._generation.vocab_size, self._generation.batch_size
        if any(not 0 <= token < vocab for token in ids):
            raise StepContractError(f"a token id outside the vocabulary (0..{vocab - 1}): {ids}")
        if any(not 0 <= row < batch for row in rows) or any(p < 0 for p in positions):
            raise StepContractError(f"rows {rows}, positions {positions}")
        if any(not 0 <= pick < len(ids) for pick in picks):
            raise StepContractError(f"picks {picks} of {len(ids)} tokens")
        # a row's tokens one after another, at consecutive positions; a token at max_seq_len or
        # past it is no row's (a join step's padding up to its graph's bucket, anywhere)
        length = self._generation.max_seq_len
        held = [(row, position) for row, position in zip(rows, positions) if position < length]
        seen: set = set()
        for t, (row, position) in enumerate(held):
            if t and held[t - 1][0] == row:
                if position != held[t - 1][1] + 1:
                    raise StepContractError(f"row {row}'s positions {positions} not consecutive")
            elif row in seen:
                raise StepContractError(f"row {row}'s tokens are not together: rows {rows}")
            seen.add(row)


class EagerDecodeGraph:
    """cuda_graphs.DecodeGraph's surface on the CPU, for the engine's path through it: a decode
    step is never replayed (`replay` is False: the engine runs it), and `join` takes a join step
    as DecodeGraph.join does (lists: its packed tokens, one pick and one drawing flag per row of
    the batch, the sampler's mode), pads its tokens to a multiple of `bucket` with tokens that
    are no row's, and runs the step, then the sampler in that mode, on the logits of every row."""

    def __init__(self, package: FakeGeneration, bucket: int = 32):
        generation = package.generation
        self.package, self.bucket = package, bucket
        self.step = DecodeStep(generation.batch_size, generation.max_seq_len, package.device)
        self.sampler = RowSampler(generation.batch_size, generation.vocab_size, package.device)
        self.joins: list[str] = []  # the sampler's mode of each join step

    def prepare_joins(self, tokens: int) -> None:
        pass

    def replay(self, mode: str) -> bool:
        return False

    def join(
        self,
        ids: list[int],
        rows: list[int],
        positions: list[int],
        picks: list[int],
        drawing: list[int],
        mode: str,
    ) -> torch.Tensor:
        pad = -len(ids) % self.bucket
        no_row = self.package.generation.max_seq_len
        padded = [ids + [0] * pad, rows + [0] * pad, positions + [no_row] * pad, picks]
        logits = self.package.call_without_graphs(*(torch.tensor(x) for x in padded))
        self.joins.append(mode)
        return self.sampler(logits, torch.tensor(drawing), mode)
