"""The decode engine: every generation on a text-generation package runs here, `generate` and
`stream` (generation.py), `aotc generate` and `aotc serve`. Sequences join a running batch and
leave it at step boundaries, each answered as if alone.

The package's program (aotc/export/row_cache.py) gives every row of its KV cache a timeline of its
own and takes a step's tokens packed (decode_step.py):

    step(input_ids [T], rows [T], positions [T], picks [R]) -> logits [R, vocab]

token t fed to row rows[t] at position positions[t]. So a row is a slot a sequence owns from its
join to its finish, and a step costs the tokens it feeds, whichever rows they are for:

- A decode step feeds every running row its last token.
- A join feeds the joining rows their prompts in chunks, oldest joiner first, at most
  `prefill_chunk` tokens of a row and `step_tokens` of all rows a step, while the same step feeds
  every running row its next token: a long prompt joins without stalling the batch, a join costs
  the running rows no step, and a joining prompt's tokens cost the step only themselves (no row is
  padded to the longest chunk). With CUDA graphs a join step is a replay too, its tokens padded
  to one of a few counts with tokens that are no row's (cuda_graphs.JOIN_BUCKETS), and so is its
  sampler.
- A sequence joins whenever a row is free and its prompt and new tokens fit a row's cache. Given
  a PrefixCache (prefix_cache.py), it starts from the longest start of its prompt that a row
  already holds (that row if it is free, else a copy into the row it takes) and is fed the rest.
- Each row picks its tokens by its own settings (sampling.RowSampler), on the device, so greedy
  and sampled sequences share the batch and a seeded one's tokens do not depend on its neighbours.
  Penalties and log-probabilities cost a step work only while a row asks for them (the sampler's
  mode); a row's log-probabilities come to the host with its token, in the same copy.
- A row held to a grammar (GenerationRequest.grammar) has its mask of allowed tokens written
  before each step from its matcher (token_grammar.py), which takes each token it picks; it
  finishes as soon as its grammar is complete.
- A row finishes at an end-of-sequence id or its last token (GenerationRequest.finish_reason),
  when its grammar is complete, or, given the package's tokenizer, at a stop string in its text
  (text_delta.py); its slot is free from the next step. Why it finished (finish_reason.py) and the
  text each token adds travel in its Made events, which every front end passes on as they are.

A decode step is one replay of the package's DecodeGraph on CUDA with CUDA graphs (the program,
the inputs' advance and the sampler captured together), one call of the package otherwise. On CUDA
the engine works ahead: up to `ahead` more decode steps are queued (each one's input is the tokens
the one before picked, still on the device) before the host reads a step's tokens, so the device
is busy while the host delivers them. A step feeds only the rows that need a token beyond those of
the steps queued before it, so none writes past a row's cache; a row that ends sooner (an
end-of-sequence id, a stop string) is seen when its step is read, and what later steps made for it
is dropped. A sequence that joins meanwhile waits for the queued steps. At batch 1 on an H200 one
step ahead already keeps the device busy: the idle left is between a graph's kernels
(docs/benchmarks.md). While a row is held to a grammar no step is queued ahead: its next mask
depends on the token the last step picked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from .decode_step import DecodeStep, pack, pack_lists
from .errors import GenerationInputError
from .finish_reason import FinishReason
from .generation_request import GenerationRequest
from .prefix_cache import PrefixCache, common_start
from .sampling import GREEDY, LOGPROBS, RowSampler
from .text_delta import TextDelta

if TYPE_CHECKING:
    from .generation_gate import GenerationGate
    from .generation_record import Generation


class GeneratingPackage(Protocol):
    """What the engine and the front ends use of a package: Package's public surface (the engine
    is typed against this, so it imports nothing of package.py)."""

    path: Path
    device: torch.device
    generation_gate: GenerationGate

    @property
    def generation(self) -> Generation: ...

    @property
    def fixed_picks(self) -> int | None: ...

    def call_without_graphs(self, *tensors: torch.Tensor) -> Any: ...

    def decode_graph(self) -> Any: ...

    def copy_cache_rows(self, source: int, target: int, positions: int) -> None: ...


class HostCopy:
    """A step's new tokens (and log-probabilities, when it made them) on the host, copied while
    the device runs the next step: the copy is queued before the next step and waited for after it
    is queued (on CUDA, into pinned memory)."""

    def __init__(self, like: Sequence[torch.Tensor]):
        self._cuda = like[0].device.type == "cuda"
        self._buffers = [torch.empty_like(t, device="cpu", pin_memory=self._cuda) for t in like]
        self._done = torch.cuda.Event() if self._cuda else None
        self._copied = 0

    def start(self, tensors: Sequence[torch.Tensor]) -> None:
        """Copies `tensors`, the first of the tensors the copy was made for."""
        for buffer, tensor in zip(self._buffers, tensors):
            buffer.copy_(tensor, non_blocking=self._cuda)
        self._copied = len(tensors)
        if self._done is not None:
            self._done.record()

    def result(self) -> list[torch.Tensor]:
        if self._done is not None:
            self._done.synchronize()
        return [buffer.clone() for buffer in self._buffers[: self._copied]]


# With overlap (CUDA), the decode steps queued beyond the one whose tokens the host reads: enough that
# a slow turn of the host (delivering text, a client's turn, a garbage collection) finds work still
# queued on the device
STEPS_AHEAD = 1


class Made(NamedTuple):
    """One new token of a sequence, the engine's event that every front end consumes: its key, the
    token, why it ended the sequence (None while it goes on; FinishReason.STOP at an
    end-of-sequence id, a stop string or a complete grammar, LENGTH at its last token, ERROR when
    its logits were not finite: its token (0) is then no pick, and its neighbours go on, as
    sampling.greedy_pick's `failed` says), the text it adds (with a tokenizer; "" without), and,
    when its request asked for them, the token's log-probability and the request's count of most
    likely tokens at this step as (token id, log-probability) pairs, most likely first (the
    log-softmax of the package's raw logits)."""

    key: Hashable
    token: int
    finish: FinishReason | None
    text: str = ""
    logprob: float | None = None
    top_logprobs: tuple = ()


@dataclass
class _Row:
    key: Hashable
    request: GenerationRequest
    prompt: list = field(default_factory=list)  # tokens still to feed before the first token
    made: int = 0
    text: TextDelta | None = None
    tokens: list = field(default_factory=list)  # the tokens made, with a prefix cache
    order: int = 0  # when it joined, among the engine's sequences: the oldest is fed first
    matcher: Any = None  # token_grammar.TokenMatcher: where the row stands in its grammar
    mask_stale: bool = True  # the matcher moved since its mask was written
    # with a prefix cache: the tokens at the row's positions 0..n-1, kept as they are fed (its
    # prompt's so far, and those it made but the last, which the next step feeds), so a server's
    # queue checks read them without rebuilding them
    fed_tokens: list = field(default_factory=list)

    def fed(self) -> list:
        return self.fed_tokens

    def made_token(self, token: int) -> None:
        """With a prefix cache: the row made `token`; the one before it is fed by now."""
        if self.tokens:
            self.fed_tokens.append(self.tokens[-1])
        self.tokens.append(token)


class DecodeEngine:
    """Generation for up to the package's batch of sequences at once, joining and leaving between
    steps (see above). The package's generation gate is held from the first join until the last
    row finishes or leaves (no other generation, call or reset moves the cache meanwhile). One
    thread uses an engine at a time."""

    def __init__(
        self,
        package: GeneratingPackage,
        overlap: bool | None = None,
        prefill_chunk: int = 256,  # the most prompt tokens a step feeds one row
        step_tokens: int = 2048,  # the most prompt tokens a step feeds all joining rows
        tokenizer: Any = None,  # a tokenizers.Tokenizer: each token's text, and stop strings
        ahead: int | None = None,  # steps queued ahead with overlap (STEPS_AHEAD)
        prefix_cache: PrefixCache | None = None,  # prompt prefixes the rows hold, reused at join
    ):
        self.package, self.device, self.tokenizer = package, package.device, tokenizer
        self.generation = generation = package.generation
        self.size, self.max_len = generation.batch_size, generation.max_seq_len
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1 token, not {prefill_chunk}")
        if step_tokens < 1:
            raise ValueError(f"step_tokens must be at least 1 token, not {step_tokens}")
        self.prefill_chunk, self.step_tokens = prefill_chunk, step_tokens
        self._joined = 0  # sequences joined so far: each row's `order`
        self.prefix_cache = prefix_cache
        self.rows: list[_Row | None] = [None] * self.size
        self.held = torch.zeros(self.size, dtype=torch.int64)  # tokens each row's cache holds
        self.last = torch.zeros(self.size, dtype=torch.int64)  # each row's token to feed next
        # the decode step's buffers and sampler (the package's decode graph's, when it has one),
        # taken when the engine first holds the package
        self.graph: Any = None
        self.decode_step: Any = None
        self.sampler: Any = None
        self._fresh = True  # rows joined or left: the decode step's buffers are loaded anew
        self._fed = torch.zeros(self.size, dtype=torch.int64)  # each row's tokens a decode step
        self._fed_rows: list[int] = [0] * self.size  # the same as a list, to compare
        self._fed_slots: list[int] = []  # the rows it feeds
        self._held_gate = False
        # on the CPU a step queued ahead would run there and then, before its tokens are sent
        self.overlap = self.device.type == "cuda" if overlap is None else overlap
        ahead = STEPS_AHEAD if ahead is None else ahead
        if ahead < 1:
            raise ValueError(f"ahead must be at least 1 step, not {ahead}")
        self.ahead = ahead  # with overlap: the most decode steps queued beyond the one read
        self._hosts: list[HostCopy] = []  # free host buffers, one per step in flight at most
        # steps queued on the device whose tokens are not read yet, oldest first: (the key of
        # each row it runs for, the host copy its tokens and log-probabilities arrive in)
        self._queued: deque[tuple[list, HostCopy]] = deque()
        self._latest: torch.Tensor | None = None  # the last queued step's tokens on the device
        self._masks: torch.Tensor | None = None  # the rows' masks on the host (grammars)

    @property
    def active(self) -> int:
        return sum(row is not None for row in self.rows)

    @property
    def has_free_row(self) -> bool:
        """Whether a sequence can join at the next step. Whether a row's cache holds it is the
        request's own check against the package (GenerationRequest.check), made once."""
        return None in self.rows

    def join(self, key: Hashable, request: GenerationRequest) -> int:
        """Queue a sequence for the next step (check `has_free_row` first); the number of its
        prompt's tokens a row already held (with a prefix cache; 0 without), which are not fed
        again. The request is checked against the package unless it was already
        (GenerationInputError names what it cannot run)."""
        request.check(self.generation)
        if request.stop and self.tokenizer is None:
            raise GenerationInputError(
                "stop strings are text: they need the package's tokenizer (export with "
                "--tokenizer DIR), or give end-of-sequence ids instead"
            )
        if not self.has_free_row:
            raise ValueError("every row of the batch is taken; check has_free_row first")
        if not self._held_gate:
            self.package.generation_gate.acquire()
            self._held_gate = True
            if self.prefix_cache is not None:
                self.prefix_cache.claim(self.package.generation_gate.turns)
            self._take_package()
        slot, reused = self._row_for(request.prompt)
        text = TextDelta(self.tokenizer, request.stop) if self.tokenizer is not None else None
        matcher = request.grammar.matcher() if request.grammar is not None else None
        self._joined += 1
        self.rows[slot] = _Row(
            key, request, list(request.prompt[reused:]), text=text, matcher=matcher,
            order=self._joined,
            fed_tokens=list(request.prompt[:reused]) if self.prefix_cache is not None else [],
        )  # fmt: skip
        self.held[slot] = reused
        self._fresh = True
        self.sampler.set(
            slot, request.sampling, request.prompt, request.logprobs, masked=matcher is not None
        )
        return reused

    def waits_for_prefix(self, prompt: Sequence[int]) -> bool:
        """Whether a sequence with `prompt` would reuse more by joining after the prompts being
        fed now: a row still being fed its prompt shares a longer start with it than any row
        holds yet (with a prefix cache; False without). A server's queue holds such a sequence
        back for the steps that feed that start once, instead of feeding it twice (requests that
        arrive together with one system prompt, a request's `n` answers); it never waits long:
        the row is fed a chunk every step."""
        cache = self.prefix_cache
        if cache is None:
            return False
        running = {slot: row.fed() for slot, row in enumerate(self.rows) if row is not None}
        _source, now = cache.find(prompt, running)
        for row in self.rows:
            if row is not None and row.prompt:
                later = min(common_start(prompt, row.request.prompt), len(prompt) - 1)
                if later >= cache.min_reused and later > now:
                    return True
        return False

    def _row_for(self, prompt: Sequence[int]) -> tuple[int, int]:
        """(the free row a joining prompt takes, the tokens of it that row holds already): the
        lowest free row without a prefix cache; with one, the row holding the longest start of
        the prompt if it is free, else a free row it is copied into (prefix_cache.py)."""
        free = [slot for slot, row in enumerate(self.rows) if row is None]
        cache = self.prefix_cache
        if cache is None:
            return free[0], 0
        running = {slot: row.fed() for slot, row in enumerate(self.rows) if row is not None}
        source, reused = cache.find(prompt, running)
        if source is not None and source in free:
            slot = source
        else:
            slot = cache.row_for(free)
            if source is not None:
                self.package.copy_cache_rows(source, slot, reused)
        cache.taken(slot, reused, copied=slot != source)
        return slot, reused

    def leave(self, key: Hashable) -> None:
        """The sequence's row is free from the next step (its client left, or a stop string
        ended it)."""
        for slot, row in enumerate(self.rows):
            if row is not None and row.key == key:
                self._free(slot)
        if self.active == 0:
            self.release()

    def release(self) -> None:
        """Give the package back (after the last row left, or when a step failed)."""
        if self.prefix_cache is not None:
            for slot, row in enumerate(self.rows):
                if row is not None:  # a step failed: what its rows hold is not known
                    self.prefix_cache.forget(slot)
        self.rows = [None] * self.size
        while self._queued:  # their tokens are nobody's now
            self._hosts.append(self._queued.popleft()[1])
        if self._held_gate:
            self._held_gate = False
            self.package.generation_gate.release()

    def step(self) -> list[Made]:
        """One step's tokens, one per row it ran for that is still there: the oldest step queued
        by an earlier call, or else a step that feeds the joining sequences a chunk of their
        prompts, or else a decode step. With overlap, up to `ahead` more decode steps are queued
        before the tokens are read, so the device never waits for the host between steps; a
        row's end is seen when its step is read, and the tokens the steps queued after it made
        for the row are dropped (what they wrote lies past the row's end, never read). A row
        whose token finishes it is free when this returns."""
        if self.active == 0:
            return []
        with torch.inference_mode():
            if not self._queued:
                self._write_masks()
                if any(row is not None and row.prompt for row in self.rows):
                    self._queue(*self._join())
                else:
                    self._queue(self._keys(), self._decode(self.last.to(self.device)))
            while self.overlap and len(self._queued) <= self.ahead and self._worth_a_step_ahead():
                assert self._latest is not None
                self._queue(self._keys(), self._decode(self._latest))
            keys, host = self._queued.popleft()
            tokens, failed, *host_logprobs = host.result()
            self._hosts.append(host)
        listed = [t.tolist() for t in host_logprobs]
        failed_rows = failed.tolist()
        made = []
        for slot, (key, token) in enumerate(zip(keys, tokens.tolist())):
            row = self.rows[slot]
            # a row that finished or left since the step was queued, or is still being fed its
            # prompt
            if key is None or row is None or row.key != key or row.prompt:
                continue
            self.last[slot] = token
            row.made += 1
            if self.prefix_cache is not None:
                row.made_token(token)
            if failed_rows[slot]:  # its logits were not finite: it ends here, alone
                made.append(Made(key, token, FinishReason.ERROR))
                self._free(slot, keep=False)  # what it holds may be what made them so
                continue
            finish = row.request.finish_reason(self.generation, token, row.made)
            if row.matcher is not None:
                row.mask_stale = True
                if not row.matcher.take(token) or row.matcher.done:
                    # complete (or, past a bug, out of its grammar)
                    finish = finish or FinishReason.STOP
            delta = ""
            if row.text is not None:
                delta, stopped = row.text.add(token, last=finish is not None)
                finish = FinishReason.STOP if stopped else finish
            made.append(Made(key, token, finish, delta, *self._logprobs(row, slot, listed)))
            if finish is not None:
                self._free(slot)
        if self.active == 0:
            self.release()
        return made

    def _write_masks(self) -> None:
        """Each row held to a grammar gets the mask of the tokens its grammar allows next, before
        the step that picks one (rows without a grammar allow every token: RowSampler.set)."""
        stale = [
            (slot, row.matcher)
            for slot, row in enumerate(self.rows)
            if row is not None and row.matcher is not None and row.mask_stale
        ]
        if not stale:
            return
        allowed = self.sampler.allowed_buffer()
        if self._masks is None:
            cuda = allowed.device.type == "cuda"
            self._masks = torch.empty(allowed.shape, dtype=torch.int32, pin_memory=cuda)
        for slot, matcher in stale:
            matcher.fill(self._masks[slot])
            allowed[slot].copy_(self._masks[slot], non_blocking=True)
            self.rows[slot].mask_stale = False  # type: ignore[union-attr]

    def _with_logprobs(self) -> bool:
        return LOGPROBS in self.sampler.mode.split("+")

    @staticmethod
    def _logprobs(row: _Row, slot: int, listed: list) -> tuple:
        """(logprob, top_logprobs) of a row's token from the step's log-probabilities on the host
        ([chosen], [top values], [top ids], each a list per row), or () if it asked for none."""
        wanted = row.request.logprobs
        if wanted is None or not listed:
            return ()
        chosen, top_values, top_ids = listed
        return chosen[slot], tuple(zip(top_ids[slot][:wanted], top_values[slot][:wanted]))

    def _take_package(self) -> None:
        """The decode step's buffers and sampler, every row free: taken under the package's gate
        (the decode graph is the package's, its state the package's cache)."""
        if self.sampler is None:
            self.graph = self.package.decode_graph()
            if self.graph is not None:
                self.decode_step, self.sampler = self.graph.step, self.graph.sampler
                self.graph.prepare_joins(self.step_tokens + self.size)
            else:
                self.decode_step = DecodeStep(self.size, self.max_len, self.device)
                self.sampler = RowSampler(self.size, self.generation.vocab_size, self.device)
            sampler = self.sampler
            outputs = [
                sampler.tokens,
                sampler.failed,
                sampler.logprob,
                sampler.top_logprobs,
                sampler.top_ids,
            ]
            # one per step in flight: the step read, and those queued beyond it
            self._hosts = [HostCopy(outputs) for _ in range(self.ahead + 1)]
        for row in range(self.size):
            self.sampler.set(row, GREEDY)
        self._fresh = True

    def _free(self, slot: int, keep: bool = True) -> None:
        row = self.rows[slot]
        if self.prefix_cache is not None and row is not None:
            if keep:
                self.prefix_cache.kept(slot, row.fed())
            else:
                self.prefix_cache.forget(slot)
        self.rows[slot] = None
        self.sampler.set(slot, GREEDY)  # a free row draws nothing
        self._fresh = True  # the row is fed nothing from now on

    def _keys(self) -> list:
        """The key of each row the next step makes a token for (None: a free row, or one whose
        last token comes from a step queued before)."""
        return [
            row.key if fed and row is not None else None
            for row, fed in zip(self.rows, self._feeding())
        ]

    def _feeding(self) -> list[int]:
        """1 for each row the next decode step feeds: a running row that needs a token beyond
        those of the steps already queued, so no step writes past a row's cache."""
        queued = len(self._queued)
        return [
            int(row is not None and row.made + queued < row.request.max_new_tokens)
            for row in self.rows
        ]

    def _queue(self, keys: list, picked: torch.Tensor) -> None:
        """Queue the copy of a step just queued: its tokens `picked` (on the device) and, when its
        rows asked for them, log-probabilities, into a host buffer of its own, before the next
        step overwrites the sampler's."""
        sampler = self.sampler
        copied = [picked, sampler.failed]
        if self._with_logprobs():
            copied += [sampler.logprob, sampler.top_logprobs, sampler.top_ids]
        host = self._hosts.pop()
        host.start(copied)
        self._queued.append((keys, host))
        self._latest = picked

    def _worth_a_step_ahead(self) -> bool:
        """No sequence waits to join, and a running row needs a token beyond those of the steps
        queued (which also keeps the steps inside the row's cache: the request's check counted
        those tokens; a row that ends sooner is fed past its end, into the padding's slot)."""
        if any(row is not None and (row.prompt or row.matcher) for row in self.rows):
            return False
        queued = len(self._queued)
        return any(
            row is not None and row.made + queued < row.request.max_new_tokens for row in self.rows
        )

    def _join(self) -> tuple[list, torch.Tensor]:
        """A step that feeds the joining rows the next chunks of their prompts (the oldest joiner
        first, within `prefill_chunk` a row and `step_tokens` in all) and each running row its last
        token; (the keys of the rows that made a token, the tokens on the device)."""
        budget = self.step_tokens
        chunks: dict[int, list] = {}
        joining = [(row.order, slot) for slot, row in enumerate(self.rows) if row and row.prompt]
        for _order, slot in sorted(joining):
            row = self.rows[slot]
            assert row is not None
            size = min(len(row.prompt), self.prefill_chunk, budget)
            if size == 0:
                break
            chunks[slot] = row.prompt[:size]
            row.prompt = row.prompt[size:]
            budget -= size
            if self.prefix_cache is not None:
                row.fed_tokens.extend(chunks[slot])
        feeds = []
        keys: list = [None] * self.size
        # read once as lists, written once: a tensor op per row cost a join step tens of µs
        held, last = self.held.tolist(), self.last.tolist()
        added = [0] * self.size
        for slot, row in enumerate(self.rows):
            if row is None:
                continue
            chunk = chunks.get(slot)
            if chunk is None:
                if row.prompt:  # its turn comes in a later step
                    continue
                chunk = [last[slot]]
            feeds.append((slot, held[slot], chunk))
            added[slot] = len(chunk)
            if not row.prompt:  # a running row, or one whose prompt is all in now: it has a token
                keys[slot] = row.key
        self.held += torch.tensor(added, dtype=torch.int64)
        slots = [slot for slot, _, _ in feeds]
        drawing = [int(key is not None) for key in keys]
        self._fresh = True
        if self.graph is not None:  # replayed at a padded token count, its picks one per row
            ids, rows, positions, picks = pack_lists(feeds)
            by_row = [0] * self.size
            for slot, pick in zip(slots, picks):
                by_row[slot] = pick
            tokens = self.graph.join(ids, rows, positions, by_row, drawing, self.sampler.mode)
            if tokens is not None:  # the sampler replayed (or ran) after the program
                return keys, tokens
        inputs = pack(feeds, self.package.fixed_picks)
        parts = [*inputs, torch.tensor(slots), torch.tensor(drawing, dtype=torch.int64)]
        *inputs, index, drawing_flags = self._on_device(parts)
        logits = self._call(inputs, slots, index)
        return keys, self.sampler(logits, drawing_flags)

    def _on_device(self, parts: list[torch.Tensor]) -> list[torch.Tensor]:
        """1-D int64 tensors on the host, on the device in one copy (from pinned memory on CUDA:
        a join step's inputs would otherwise be six copies, each a wait)."""
        flat = torch.cat(parts)
        if self.device.type == "cuda":
            flat = flat.pin_memory().to(self.device, non_blocking=True)
        return list(flat.split([len(part) for part in parts]))

    def _decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Queues the decode step that feeds each running row its token of `tokens` [B] (on the
        device); returns the buffer its tokens will be in. After a decode step the ids buffer
        already holds them; after a join or a leave, or when a row has had its last token from
        the steps queued before, the step's buffers are loaded anew."""
        step = self.decode_step
        fed = self._feeding()
        if self._fresh or fed != self._fed_rows:  # the rows fed (1 each) changed
            self._fed_rows = fed
            self._fed = torch.tensor(fed, dtype=torch.int64)
            self._fed_slots = [slot for slot, f in enumerate(fed) if f]
            step.load(tokens, self.held.to(self.device), self._fed.to(self.device))
            self._fresh = False
        mode = self.sampler.mode
        if self.graph is None or not self.graph.replay(mode):
            logits = self._decode_fed(step)
            step.advance()
            step.ids.copy_(self.sampler(logits, step.fed, mode))
        self.held += self._fed  # what the step's own advance does to its buffers, mirrored here
        return self.sampler.tokens

    def _decode_fed(self, step: Any) -> torch.Tensor:
        """The decode step's logits [B, vocab] without a graph: the rows it feeds only (a free
        row would cost the step a token's projections and MLP), the others 0."""
        slots = self._fed_slots
        if len(slots) == self.size or not slots:
            return self.package.call_without_graphs(*step.inputs)
        count = self.package.fixed_picks or len(slots)
        picks = torch.arange(count, dtype=torch.int64).clamp(max=len(slots) - 1)
        index, picks = self._on_device([torch.tensor(slots), picks])
        inputs = [step.ids[index], index, step.positions[index], picks]
        return self._call(inputs, slots, index)

    def _call(self, inputs: list, slots: list[int], index: torch.Tensor) -> torch.Tensor:
        """The package's step on packed `inputs` whose picks are, in order, the tokens of rows
        `slots` (`index` on the device; a package of fixed picks repeats after them); logits
        [B, vocab], the rows not picked 0 (the sampler keeps a row's state at its index)."""
        logits = self.package.call_without_graphs(*inputs)
        if len(slots) == self.size and slots == list(range(self.size)):
            return logits
        full = logits.new_zeros((self.size, logits.shape[1]))
        full[index] = logits[: len(slots)]
        return full
