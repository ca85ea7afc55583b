"""CUDA-graph replay for packages built with reduce-overhead / max-autotune on CUDA.

Inductor's own cudagraph option (triton.cudagraphs) does nothing for an ahead-of-time package, so
the runtime does what torch.compile's reduce-overhead does: on the first call for each input
signature (shapes, dtypes) it warms the package up on a side stream, captures one call into a
CUDA graph with static input buffers, and from then on copies the inputs into those buffers and
replays the graph: one launch instead of one per kernel.

Outputs are returned as fresh tensors (cloned from the graph's static outputs), so a caller may
keep them across calls; the clone is one small device copy per output. With `reuse_outputs` the
graph's own output buffers are returned instead, as torch.compile's reduce-overhead does: the next
call for the same input shapes overwrites them. If capture fails (an op that cannot be captured),
that signature falls back to plain calls, with one warning.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .sampling import GREEDY_ONLY

WARMUP_CALLS = 2  # the first calls allocate workspaces and pick algorithms; capture after them

T = TypeVar("T")


class _Graph:
    def __init__(
        self,
        graph: torch.cuda.CUDAGraph,
        static_inputs: list[torch.Tensor],
        static_outputs: list[torch.Tensor],
    ):
        self.graph = graph
        self.static_inputs = static_inputs
        self.static_outputs = static_outputs


_WARMUP_STREAMS: dict = {}  # device index -> the one side stream warm-ups run on


def _warmup_stream(device: torch.device) -> Any:
    """One side stream per device for every capture's warm-up, never a new one: AOTInductor keeps
    state for each stream a model ever ran on (measured on the H100: 33 MiB of allocated memory a
    new stream, never returned), so a stream per load grew GPU memory at every reload."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[index] = torch.cuda.Stream(device)
    return _WARMUP_STREAMS[index]


class _GraphPool:
    """How every graph here is made, and the one memory pool the graphs of an owner (a package's
    runner, a decode graph) share: only one of them replays at a time, so one's temporaries may be
    another's. `make` is the usual order; a caller that needs what its warm-up made before it
    captures calls `warm_up` and `capture` itself."""

    def __init__(self, device: torch.device):
        self._device = device
        self._handle: Any = None  # made at the first capture

    def make(
        self, warm: Callable[[], object], work: Callable[[], T]
    ) -> tuple[torch.cuda.CUDAGraph, T]:
        """(a graph of `work`, what `work` returned during its capture) after `warm`'s calls."""
        self.warm_up(warm)
        return self.capture(work)

    def warm_up(self, work: Callable[[], T]) -> T:
        """`work` run on the device's warm-up stream, after what the current stream queued before
        and before what it queues next: the first calls allocate workspaces and pick algorithms,
        which a capture must not do."""
        current = torch.cuda.current_stream(self._device)
        side = _warmup_stream(self._device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            done = work()
        current.wait_stream(side)
        return done

    def capture(self, work: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
        """(a CUDA graph of `work` in the pool, what `work` returned: tensors of the pool, which
        each replay writes anew)."""
        if self._handle is None:
            self._handle = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._handle):
            done = work()
        return graph, done


def _capture_failed(device: torch.device, what: str, exc: Exception, instead: str) -> None:
    """One warning for a capture that failed, and the device left with nothing in flight."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    print(
        f"aotc_runtime: CUDA-graph capture {what} failed ({type(exc).__name__}: {first}); {instead}",
        file=sys.stderr,
    )
    torch.cuda.synchronize(device)


class CudaGraphRunner:
    def __init__(
        self,
        run_flat: Callable[..., list[torch.Tensor]],
        device: torch.device,
        reuse_outputs: bool = False,
        written_inputs: int = 0,
    ):
        self._run_flat = run_flat
        self._device = device
        self._reuse_outputs = reuse_outputs
        # the last `written_inputs` inputs are ones the program updates in place (a package's
        # state): a replay writes their static buffers, which are copied back to the caller's
        self._written_inputs = written_inputs
        self._graphs: dict = {}
        self._uncapturable: set = set()
        self._pool = _GraphPool(device)  # one memory pool shared by every graph of this package
        # A graph replays into static input and output buffers: one call at a time. Calls from
        # threads on other CUDA streams are ordered after the previous call's work on its stream.
        self._lock = threading.Lock()
        self._last_stream: Any = None

    def __call__(self, flat: list[torch.Tensor], key: tuple | None = None) -> list[torch.Tensor]:
        with self._lock:
            stream = torch.cuda.current_stream(self._device)
            if self._last_stream is not None and self._last_stream != stream:
                stream.wait_stream(self._last_stream)
            self._last_stream = stream
            return self._call(flat, key)

    def _call(self, flat: list[torch.Tensor], key: tuple | None) -> list[torch.Tensor]:
        if key is None:
            key = tuple((t.shape, t.dtype) for t in flat)
        entry = self._graphs.get(key)
        if entry is None:
            if key in self._uncapturable or torch.cuda.is_current_stream_capturing():
                return self._run_flat(flat)
            entry = self._capture(key, flat)
            if entry is None:
                return self._run_flat(flat)
        for static, given in zip(entry.static_inputs, flat):
            static.copy_(given, non_blocking=True)
        entry.graph.replay()
        if self._written_inputs:
            n = self._written_inputs
            for given, static in zip(flat[-n:], entry.static_inputs[-n:]):
                given.copy_(static, non_blocking=True)
        if self._reuse_outputs:
            return entry.static_outputs
        return [out.clone() for out in entry.static_outputs]

    @property
    def captured_signatures(self) -> int:
        return len(self._graphs)

    def _capture(self, key: tuple, flat: list[torch.Tensor]) -> _Graph | None:
        static_inputs = [t.detach().clone() for t in flat]

        def warm() -> None:
            for _ in range(WARMUP_CALLS):
                self._run_flat(static_inputs)

        try:
            graph, static_outputs = self._pool.make(
                warm, lambda: list(self._run_flat(static_inputs))
            )
        except Exception as exc:  # capture is an optimisation: never fail the call because of it
            self._uncapturable.add(key)
            inputs = [list(s) for s, _ in key]
            _capture_failed(self._device, f"for inputs {inputs}", exc, "running without graphs")
            return None
        entry = _Graph(graph, static_inputs, static_outputs)
        self._graphs[key] = entry
        return entry


# The token counts a join step is replayed at: its tokens padded up to the smallest that holds
# them, with tokens that are no row's (position max_len: they write the padding's slot and read
# nothing). A step over more tokens than the largest runs without a graph.
JOIN_BUCKETS = (32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096)


class _JoinGraph:
    """One join bucket's graph: its inputs are views of one device buffer, filled from one pinned
    host buffer per replay: ids, rows, positions (the bucket's tokens), picks (one per row of the
    batch) and the rows that draw a token (which the graph copies to the join sampler's input)."""

    def __init__(self, tokens: int, batch: int, max_len: int, device: torch.device):
        self.tokens, self.batch, self.max_len = tokens, batch, max_len
        size = 3 * tokens + 2 * batch
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=True)
        self.flat = torch.zeros(size, dtype=torch.int64, device=device)
        self.flat[2 * tokens : 3 * tokens].fill_(max_len)  # every token no row's until filled
        sizes = (tokens, tokens, tokens, batch, batch)
        self.ids, self.rows, self.positions, self.picks, self.drawing = self.flat.split(sizes)
        self.copied = torch.cuda.Event()  # the host buffer may be written again after it
        self.graph: torch.cuda.CUDAGraph | None = None

    @property
    def inputs(self) -> list[torch.Tensor]:
        return [self.ids, self.rows, self.positions, self.picks]

    def load(
        self,
        ids: list[int],
        rows: list[int],
        positions: list[int],
        picks: list[int],
        drawing: list[int],
    ) -> None:
        """The step's inputs (its packed tokens; `picks` and `drawing` one per row of the batch),
        the bucket's other tokens no row's, in one copy. The host buffer's contents are built as
        one int64 array from the lists: a torch op per part (or a tensor per list) cost the
        host several times as much."""
        pad = self.tokens - len(ids)
        no_row = array("q", [0]) * pad
        values = array("q", ids)
        values += no_row
        values.fromlist(rows)
        values += no_row
        values.fromlist(positions)
        values += array("q", [self.max_len]) * pad
        values.fromlist(picks)
        values.fromlist(drawing)
        self.copied.synchronize()
        self.host.copy_(torch.frombuffer(values, dtype=torch.int64))
        self.flat.copy_(self.host, non_blocking=True)
        self.copied.record()


class DecodeGraph:
    """A text-generation package's decode step as CUDA graphs, its KV cache kept in place.

    The runner above copies every input into its static buffers and clones every output at each
    call: with a KV cache as state, that is the whole cache copied per token, and one capture per
    prompt length if prefill went through it too. Here decode is captured (one shape per package:
    a token per row, a free row's token no row's), the cache lives in this graph's own `state`
    buffers, which the program updates in place (the new positions only), and the captured work is
    the whole step:
    the program, the step's own inputs advanced for the next step (`step.advance`), and the
    sampler's choice of each row's next token written into the ids buffer. A decode step is one
    replay: no host value (a position, a token) travels to the device per token.

    The sampler's work depends on its mode (greedy only, sampled, filtered, each with or without
    penalties and log-probabilities: sampling.RowSampler), so a graph is captured per mode the
    first time a step needs it, all sharing one memory pool: a batch with a penalized row or one
    that asks for log-probabilities replays a graph too (its counts, its prompt's tokens and its
    log-probabilities are the sampler's buffers, updated by the replay), and a greedy batch's
    graph still does none of that work.

    A join step (prompts fed beside the running rows' tokens: `join`) is replayed too, its tokens
    padded up to the smallest of JOIN_BUCKETS with tokens that are no row's, each bucket captured
    the first time a step needs it: the program, its logits picked one per row, and a copy of
    those logits and of the rows' drawing flags into two buffers every bucket shares. The
    sampler's work on those buffers is a graph of its own per mode (captured at a mode's first
    join step, the greedy one when the engine takes the package), so a join step is two replays,
    the bucket's then its mode's sampler, and the sampler's state advances as in a decode step. A
    join step launched kernel by kernel spent more time on the host than on the GPU
    (docs/benchmarks.md, "Packed prefill"), and so did its sampler called op by op after the
    replay ("Join steps replayed as CUDA graphs").

    ExecuTorch's CUDA backend captures its decode method the same way (static inputs, the cache as
    the model's own buffers); the difference here is that the inputs' advance and the choice of the
    next tokens are captured too.
    """

    def __init__(
        self,
        run_flat: Callable[[list[torch.Tensor]], list[torch.Tensor]],
        device: torch.device,
        step: Any,  # decode_step.DecodeStep: its buffers and advance()
        sampler: Any,  # sampling.RowSampler: its buffers are the graph's
        state: list[torch.Tensor],
        settings: Callable[[], Any],  # the package's run_settings: the flags kernels are chosen by
    ):
        # made outside inference mode (generation captures inside it): these become the package's
        # state, which reset_state and a decode engine write outside it, and an inference tensor
        # refuses that ("Inplace update to inference tensor outside InferenceMode")
        with torch.inference_mode(False):
            self.state = [t.clone() for t in state]
        self.step, self.sampler = step, sampler
        self._run_flat, self._device, self._settings = run_flat, device, settings
        self._graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self._failed: set[str] = set()
        self._pool = _GraphPool(device)  # one pool for every mode's and bucket's graph
        self._warm_logits: torch.Tensor | None = None  # the warm-up's, for each mode's warm-up
        self._joins: dict[int, _JoinGraph] = {}  # join steps' graphs, by bucket
        self._failed_joins: set[int] = set()
        # The join sampler's inputs, one pair for every bucket, whose graph copies its logits and
        # drawing flags there: [B, vocab] in the program's logits' dtype (made at the first
        # bucket's capture) and [B]. Made outside inference mode, as `state` is: a capture outside
        # it (prepare_joins) writes them.
        self._join_logits: torch.Tensor | None = None
        with torch.inference_mode(False):
            self._join_drawing = torch.zeros_like(step.fed)
        self._join_samplers: dict[str, torch.cuda.CUDAGraph] = {}  # by sampler mode
        self._failed_join_samplers: set[str] = set()

    @property
    def captured_modes(self) -> set:
        """The sampler modes whose step replays as a graph."""
        return set(self._graphs)

    @property
    def captured_join_modes(self) -> set:
        """The sampler modes whose join steps' sampler replays as a graph."""
        return set(self._join_samplers)

    def replay(self, mode: str) -> bool:
        """Runs the step on what the step's buffers hold, its tokens left in `sampler.tokens` and
        the ids buffer; False (nothing run) when this mode's graph cannot be captured, with one
        warning: the caller runs the step without it."""
        graph = self._graphs.get(mode)
        if graph is None:
            if mode in self._failed:
                return False
            graph = self._capture(mode)
            if graph is None:
                return False
        graph.replay()
        return True

    def _capture(self, mode: str) -> torch.cuda.CUDAGraph | None:
        flat = self.step.inputs + self.state
        try:
            with self._settings():
                return self._capture_in(mode, flat)
        except Exception as exc:  # capture is an optimisation: never fail the call because of it
            self._failed.add(mode)
            _capture_failed(self._device, "of the decode step", exc, "decoding without graphs")
            return None

    def _capture_in(self, mode: str, flat: list[torch.Tensor]) -> torch.cuda.CUDAGraph:
        # The program on the step's inputs, once: it writes the cache positions the next replay
        # writes, with the same values. Then the sampler's work in this mode, which changes
        # nothing it keeps (its counts and draws advance only in `__call__`).
        def warm() -> None:
            if self._warm_logits is None:
                for _ in range(WARMUP_CALLS):
                    logits = self._run_flat(flat)[0]
                self._warm_logits = logits
            self.sampler.warm_up(self._warm_logits, mode)

        def whole_step() -> None:
            logits = self._run_flat(flat)[0]
            self.step.advance()
            self.step.ids.copy_(self.sampler(logits, self.step.fed, mode))

        graph, _ = self._pool.make(warm, whole_step)
        self._graphs[mode] = graph
        return graph

    def prepare_joins(self, tokens: int) -> None:
        """Capture the join buckets up to the one that holds `tokens` (a step's most), and the
        join sampler of a batch of greedy rows, so that no request waits for a capture later (as
        vLLM captures its sizes at start)."""
        for bucket in self._join_buckets():
            if bucket not in self._joins and bucket not in self._failed_joins:
                self._capture_join(bucket)
            if bucket >= tokens:
                break
        self._join_sampler(GREEDY_ONLY)

    def join(
        self,
        ids: list[int],
        rows: list[int],
        positions: list[int],
        picks: list[int],
        drawing: list[int],
        mode: str,
    ) -> torch.Tensor | None:
        """A join step (its packed tokens, one pick and one drawing flag per row of the batch)
        replayed at the smallest bucket that holds its tokens, then the sampler in `mode` on its
        logits (replayed, or called where its graph cannot be captured): its tokens, in
        `sampler.tokens` as a decode step leaves them (with `failed` and, in a mode with them,
        the log-probabilities). None when no bucket holds the step or its capture failed: nothing
        ran, and the caller runs the step without a graph."""
        bucket = next((b for b in self._join_buckets() if b >= len(ids)), None)
        if bucket is None or bucket in self._failed_joins:
            return None
        entry = self._joins.get(bucket)
        if entry is None:
            entry = self._capture_join(bucket)
            if entry is None:
                return None
        sampler = self._join_sampler(mode)  # captured (at its first need) before the step runs
        entry.load(ids, rows, positions, picks, drawing)
        assert entry.graph is not None and self._join_logits is not None
        entry.graph.replay()
        if sampler is None:
            return self.sampler(self._join_logits, self._join_drawing, mode)
        sampler.replay()
        return self.sampler.tokens

    def _join_buckets(self) -> list[int]:
        """JOIN_BUCKETS within the step's tokens (at most every row's whole cache), that most
        the last."""
        most = self.step.ids.shape[0] * self.step.max_len
        return [b for b in JOIN_BUCKETS if b < most] + [most]

    def _capture_join(self, bucket: int) -> _JoinGraph | None:
        """The program over `bucket` tokens, captured on inputs that are all no row's (what the
        warm-up and the capture write goes to the padding's slot, never read), then its logits
        and the drawing flags copied to the join sampler's inputs."""
        batch = self.step.ids.shape[0]
        entry = _JoinGraph(bucket, batch, self.step.max_len, self._device)
        flat = entry.inputs + self.state

        def warm() -> torch.Tensor:
            for _ in range(WARMUP_CALLS):
                logits = self._run_flat(flat)[0]
            return logits

        def program() -> None:
            assert self._join_logits is not None  # made after the warm-up, before the capture
            self._join_logits.copy_(self._run_flat(flat)[0])
            self._join_drawing.copy_(entry.drawing)

        try:
            with self._settings():
                warm_logits = self._pool.warm_up(warm)
                if self._join_logits is None:
                    # the logits' dtype is known now. Made outside the capture: made inside, it
                    # would be the pool's, maybe where an earlier graph keeps its temporaries
                    with torch.inference_mode(False):
                        self._join_logits = torch.zeros_like(warm_logits)
                entry.graph, _ = self._pool.capture(program)
        except Exception as exc:  # capture is an optimisation: never fail the step because of it
            self._failed_joins.add(bucket)
            _capture_failed(
                self._device, f"of a join step of {bucket} tokens", exc, "joining without graphs"
            )
            return None
        self._joins[bucket] = entry
        return entry

    def _join_sampler(self, mode: str) -> torch.cuda.CUDAGraph | None:
        """The join steps' sampler in `mode` as a graph, captured at its first need; None where it
        cannot be (one warning), or before a bucket's capture made its inputs."""
        graph = self._join_samplers.get(mode)
        if graph is None and mode not in self._failed_join_samplers:
            graph = self._capture_join_sampler(mode)
        return graph

    def _capture_join_sampler(self, mode: str) -> torch.cuda.CUDAGraph | None:
        """`sampler(join logits, join drawing flags, mode)` captured, as the decode step captures
        it: every value the call reads or advances (settings, seeds and draw counts, penalty
        counts, masks) is a sampler buffer and its random numbers a hash of a row's seed and
        count (no generator state), so a replay does what the call would on the buffers as they
        are then. Its warm-up on what the buffers hold changes nothing (RowSampler.warm_up)."""
        logits, drawing = self._join_logits, self._join_drawing
        if logits is None:
            return None
        try:
            graph, _ = self._pool.make(
                lambda: self.sampler.warm_up(logits, mode),
                lambda: self.sampler(logits, drawing, mode),
            )
        except Exception as exc:  # capture is an optimisation: never fail the step because of it
            self._failed_join_samplers.add(mode)
            _capture_failed(
                self._device,
                f"of the join steps' sampler ({mode})",
                exc,
                "sampling join steps without a graph",
            )
            return None
        self._join_samplers[mode] = graph
        return graph
