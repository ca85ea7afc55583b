"""How long the stages of an export or a build will take on this machine: the estimate their progress
line shows.

A stage's time is modelled as a fixed part plus a rate times the run's work, where each stage has
its own measure of work (an artifact's bytes to load it, the program's node count to lower,
compile and check it, a model's module count to trace it). After a run that succeeded, each stage's
observed rate, (seconds - fixed) / work, is kept in aotc's cache folder per kind of run (the
command, device, mode, precision or quantization, and task); the estimate is the median of the
last few rates of that kind times this run's work. Before any run of a kind on this machine, the
rates measured on a quiet 2-core CPU machine (PRIOR) stand in, where there is one.

The record is a hint, never an input to what is built: a missing, foreign or unreadable one means
no estimate, and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

RECORD_FILE = "stage_times.json"
MAX_RECORD_BYTES = 1 << 20  # a record larger than this was not written by aotc: ignored
RATES_KEPT = 8  # per kind and stage: recent machines' load, not last month's
MAX_KINDS = 64


@dataclass(frozen=True)
class StageCost:
    """A stage's time as `fixed` seconds plus `rate` seconds per unit of its work."""

    fixed: float
    rate: float

    def seconds(self, work: float) -> float:
        return self.fixed + self.rate * max(work, 0.0)


# Measured 2026-11-28 on the quiet 2-core CI machine with fresh caches: the fixed parts from
# examples/mlp.py (a dozen nodes: the wrapper's g++ compile, starting the check's child), the rates
# from SmolLM2-135M-Instruct's text-generation artifact (547 MB, 2,574 nodes, 2,048 positions):
# fp32 load 14.2 s, lower 29.1, compile 130.6, check 48.6; int8-weight-only load 17.9, lower 131.5,
# compile 247.5, check 63.9.
# Exports: examples/mlp.py for the fixed parts, SmolLM2's folder (538 MB of safetensors, 457
# modules, 566 MB of state) for the rates: load 30.4 s (transformers' import among it), run once
# 6.3, trace 35.9, save 5.9.
_LOAD = StageCost(0.1, 2.6e-8)
_EXPORT = {
    "eager": StageCost(0.05, 0.013),
    "trace": StageCost(3.5, 0.071),
    "save": StageCost(0.2, 9e-9),
}
PRIOR: dict[str, dict[str, StageCost]] = {
    "export:file:one-call": {"load": StageCost(0.1, 4.1e-8), **_EXPORT},
    "export:folder:one-call": {"load": StageCost(8.0, 4.1e-8), **_EXPORT},
    "export:folder:text-generation": {"load": StageCost(8.0, 4.1e-8), **_EXPORT},
    "build:cpu:default:fp32:one-call": {
        "load": _LOAD,
        "lower": StageCost(0.1, 0.011),
        "compile": StageCost(12.0, 0.046),
        "check": StageCost(3.5, 0.017),
    },
    "build:cpu:default:fp32:text-generation": {
        "load": _LOAD,
        "lower": StageCost(1.0, 0.011),
        "compile": StageCost(12.0, 0.046),
        "check": StageCost(6.0, 0.017),
    },
    "build:cpu:default:int8-weight-only:text-generation": {
        "load": _LOAD,
        "lower": StageCost(1.0, 0.051),
        "compile": StageCost(12.0, 0.092),
        "check": StageCost(6.0, 0.023),
    },
}


def build_kind(
    device: str, mode: str, precision: str, quantize: str | None, task: dict | None
) -> str:
    what = quantize or precision
    return f"build:{device}:{mode}:{what}:{'text-generation' if task else 'one-call'}"


def export_kind(folder: bool, task: str | None) -> str:
    return f"export:{'folder' if folder else 'file'}:{task or 'one-call'}"


class StageEstimates:
    """Estimates for one run of one kind, and the record of it once it succeeded."""

    def __init__(self, kind: str, root: Path | None = None):
        self.kind = kind
        self.root = root
        self.work: dict[str, float] = {}
        self._rates = _read(root).get(kind, {}) if root else {}

    @classmethod
    def for_this_machine(cls, kind: str) -> StageEstimates:
        """With the record in aotc's cache folder, or none when that folder is not usable."""
        from aotc.cache_dir import private_cache_root
        from aotc.errors import UserInputError

        try:
            return cls(kind, private_cache_root())
        except UserInputError:
            return cls(kind, None)

    def seconds(self, stage: str, work: float) -> float | None:
        """The estimate of `stage` at `work`, or None when nothing is known of this kind's stage."""
        self.work[stage] = work
        prior = PRIOR.get(self.kind, {}).get(stage)
        rates = self._rates.get(stage)
        if rates:
            fixed = prior.fixed if prior else 0.0
            return StageCost(fixed, statistics.median(rates)).seconds(work)
        return prior.seconds(work) if prior else None

    def record(self, seconds: dict[str, float]) -> None:
        """Keep the rates of this (succeeded) run's stages: `seconds` by stage, for the stages
        given a work figure. A record that cannot be written is left as it was."""
        if self.root is None:
            return
        record = _read(self.root)
        kind = record.setdefault(self.kind, {})
        for stage, took in seconds.items():
            work = self.work.get(stage)
            if not work or work <= 0:
                continue
            prior = PRIOR.get(self.kind, {}).get(stage)
            rate = max(took - (prior.fixed if prior else 0.0), 0.0) / work
            kind[stage] = ([*kind.get(stage, []), rate])[-RATES_KEPT:]
        while len(record) > MAX_KINDS:  # oldest kinds first (dicts keep insertion order)
            record.pop(next(iter(record)))
        record[self.kind] = record.pop(self.kind)  # this kind is now the newest
        _write(self.root / RECORD_FILE, record)


def _read(root: Path) -> dict:
    """The record's kinds -> stages -> rates, keeping only well-formed entries."""
    path = root / RECORD_FILE
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_RECORD_BYTES + 1)
        if len(text) > MAX_RECORD_BYTES:
            return {}
        data = json.loads(text or b"{}")
        if not isinstance(data, dict):
            return {}
    except (OSError, ValueError, RecursionError):
        return {}
    clean: dict = {}
    for kind, stages in list(data.items())[-MAX_KINDS:]:
        if not isinstance(stages, dict):
            continue
        clean[str(kind)] = {
            str(stage): [float(r) for r in rates[-RATES_KEPT:] if _is_rate(r)]
            for stage, rates in stages.items()
            if isinstance(rates, list) and any(_is_rate(r) for r in rates[-RATES_KEPT:])
        }
    return clean


def _is_rate(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e6


def _write(path: Path, record: dict) -> None:
    """Atomically (a concurrent build reads the old record or the new one, never half of one)."""
    with contextlib.suppress(OSError):
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".stage_times.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise


def describe(seconds: float) -> str:
    """A duration as a person reads an estimate: "about 40s", "about 4 min"."""
    if seconds < 60:
        return f"about {max(5, round(seconds / 5) * 5)}s"
    if seconds < 3600:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.1f} h"
