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
from collections.abc import Callable
from typing import Any

import torch

WARMUP_CALLS = 2  # the first calls allocate workspaces and pick algorithms; capture after them


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
        self._pool: Any = None  # one memory pool shared by every graph of this package
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
        try:
            side = _warmup_stream(self._device)
            side.wait_stream(torch.cuda.current_stream(self._device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    self._run_flat(static_inputs)
            torch.cuda.current_stream(self._device).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                static_outputs = list(self._run_flat(static_inputs))
        except Exception as exc:  # capture is an optimisation: never fail the call because of it
            self._uncapturable.add(key)
            print(
                f"aotc_runtime: CUDA-graph capture failed for inputs {[list(s) for s, _ in key]} "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); running without graphs",
                file=sys.stderr,
            )
            torch.cuda.synchronize(self._device)
            return None
        entry = _Graph(graph, static_inputs, static_outputs)
        self._graphs[key] = entry
        return entry


class DecodeGraph:
    """A text-generation package's decode step as one CUDA graph, its KV cache kept in place.

    The runner above copies every input into its static buffers and clones every output at each
    call: with a KV cache as state, that is the whole cache copied per token, and one capture per
    prompt length if prefill went through it too. Here only decode is captured (one shape per
    package: a token per sequence), the cache lives in this graph's own `state` buffers, which the
    program updates in place (the new positions only), and the captured work is the whole step:
    the program and the step's own inputs advanced for the next step (`step.advance`). A decode
    step is then: write the new tokens into the ids buffer, one replay. (A package from before
    in-place state returns the new cache instead; the graph then copies it back over the old.)

    ExecuTorch's CUDA backend captures its decode method the same way (static inputs, the cache as
    the model's own buffers); the difference here is that the inputs' advance and the greedy choice
    of the next tokens are captured too, so no host value (a position, a mask column, a token)
    travels to the device per token, and a greedy step is one replay.
    """

    def __init__(
        self,
        run_flat: Callable[[list[torch.Tensor]], list[torch.Tensor]],
        device: torch.device,
        step: Any,  # generation.DecodeStep: its buffers and advance()
        state: list[torch.Tensor],
        n_outputs: int,
        pick: Any,  # generation.GreedyPick: the next tokens chosen on the device, captured too
        state_in_place: bool = True,
    ):
        # made outside inference mode (generate captures inside it): these become the package's
        # state, which reset_state and a running batch (continuous.py) write outside it, and an
        # inference tensor refuses that ("Inplace update to inference tensor outside InferenceMode")
        with torch.inference_mode(False):
            self.state = [t.clone() for t in state]
        self._step, self.pick = step, pick
        self._graph = torch.cuda.CUDAGraph()
        flat = step.inputs + self.state
        side = _warmup_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            # the program only; it may write this graph's state, which load_state replaces
            for _ in range(WARMUP_CALLS):
                run_flat(flat)
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.cuda.graph(self._graph):
            outputs = run_flat(flat)
            if not state_in_place:
                for old, new in zip(self.state, outputs[n_outputs:]):
                    old.copy_(new)
            step.advance()
            # a greedy generation reads its tokens here; a sampled one ignores them and writes
            # its own into the ids buffer before the next replay (the pick's buffers are its own)
            pick(outputs[0], step.ids)
        self.logits = outputs[0]

    def load_state(self, state: list[torch.Tensor]) -> None:
        for mine, given in zip(self.state, state):
            if mine is not given:  # the package's state is this graph's after the first generate
                mine.copy_(given)

    def __call__(self) -> torch.Tensor:
        """Runs the step on what the step's buffers hold; the logits' buffer is overwritten by the
        next replay."""
        self._graph.replay()
        return self.logits
