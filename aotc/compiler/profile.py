"""Where a build's time went, from the timers Inductor already keeps.

Inductor wraps its phases (graph lowering, autotuning of GEMM/conv templates, coordinate-descent
tuning of each Triton kernel, the C++ compile) in `torch._dynamo.utils.dynamo_timed`, which appends
each duration to `compilation_time_metrics`. Taking the difference around one compile gives a
breakdown that explains a slow build (a max-autotune build is mostly tuning) without any timers
of ours inside Inductor. The phases nest, so their seconds overlap and do not add up to the total.
"""

from __future__ import annotations

from contextlib import contextmanager

# Phases under this many seconds in total are left out: the record is for reading, not for tooling.
SHOWN_FROM_SECONDS = 0.5
MOST_SHOWN = 12


@contextmanager
def inductor_phase_times(into: dict):
    """Fill `into` with {phase: {"seconds": total, "calls": n}} for the phases run inside the block."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:  # a torch without the timers: the build goes on without a breakdown
        yield
        return
    before = {key: len(values) for key, values in compilation_time_metrics.items()}
    try:
        yield
    finally:
        into.update(_new_entries(compilation_time_metrics, before))


def _new_entries(metrics: dict, before: dict) -> dict:
    phases = {}
    for key, values in metrics.items():
        new = values[before.get(key, 0) :]
        total = sum(new)
        if total >= SHOWN_FROM_SECONDS:
            phases[key] = {"seconds": round(total, 2), "calls": len(new)}
    ranked = sorted(phases.items(), key=lambda item: -item[1]["seconds"])[:MOST_SHOWN]
    return dict(ranked)


class TuningProgress:
    """How far Inductor's tuning got since this object was made, in words, from its own counters.

    For the build's heartbeat: a max-autotune build spends most of its time benchmarking GEMM and
    convolution choices and coordinate-descent configs, and these counters are what moves.
    Returns "" while nothing was tuned (every default-mode build).
    """

    PHASES = (
        ("select_algorithm_autotune", "GEMM/conv ops autotuned"),
        ("select_algorithm_num_precompiles", "template choices compiled"),
        ("coordesc_tuning_bench", "coordinate-descent trials"),
    )

    def __init__(self):
        self.start = self._read()

    @staticmethod
    def _read() -> dict:
        try:
            from torch._dynamo.utils import counters
        except ImportError:
            return {}
        inductor = counters.get("inductor", {})
        return {key: inductor.get(key, 0) for key, _words in TuningProgress.PHASES}

    def __call__(self) -> str:
        now = self._read()
        parts = [
            f"{now[key] - self.start.get(key, 0)} {words}"
            for key, words in self.PHASES
            if now.get(key, 0) > self.start.get(key, 0)
        ]
        return ", ".join(parts)
