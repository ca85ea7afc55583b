"""`aotc explain`: why a model does or does not go through `aotc export`, in terms of the user's code.

Two views of the same model on the same example inputs, and nothing written to disk:
- JIT: torch._dynamo.explain (graphs, graph breaks with file:line, reason and fix, ops per graph);
- export: torch.export in non-strict and strict mode, and for each failing mode every problem
  torch.export.draft_export can list (it keeps tracing past the first one), each with a fix.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from aotc.config import ExportConfig
from aotc.env_vars import env_set
from aotc.errors import ExportError
from aotc.explain.jit import JitView, jit_view, user_output_hidden
from aotc.export.call_structure import output_layout
from aotc.export.loading import LoadedModel
from aotc.export.problems import Problem, diagnose, draft_failure_problem
from aotc.export.shapes import export_dynamic_shapes
from aotc.export.trace import check_eager, export_program, flat_module, prepare_model
from aotc.quiet import quiet_torch

NON_STRICT, STRICT = "non-strict", "strict"


@dataclass(frozen=True)
class ExplainConfig:
    """The flags of `aotc export` that decide what is traced (no output: explain writes nothing)."""

    model: str
    input_shapes: tuple = ()
    dims: tuple = ()
    dtypes: tuple = ()
    entry: str | None = None
    weights: Path | None = None
    strict: bool = False  # judge the mode `aotc export --strict` would use

    def export_config(self) -> ExportConfig:
        # force=True: the placeholder output is never written, so its existence is no problem.
        return ExportConfig(
            model=self.model,
            output=Path(os.devnull),
            input_shapes=self.input_shapes,
            dims=self.dims,
            dtypes=self.dtypes,
            entry=self.entry,
            weights=self.weights,
            strict=self.strict,
            force=True,
        )

    def validate(self) -> None:
        self.export_config().validate()


@dataclass
class ExportAttempt:
    mode: str
    ok: bool
    problems: list = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "problems": [p.to_dict() for p in self.problems],
        }


@dataclass
class Finding:
    """One problem, and the export modes it stops."""

    problem: Problem
    modes: list

    def to_dict(self) -> dict:
        return {**self.problem.to_dict(), "modes": self.modes}


@dataclass
class ExplainReport:
    model: str
    inputs: (
        list  # per input: {"shape": as given (dim names kept), "example": traced sizes, "dtype"}
    )
    mode: str  # the mode `aotc export` would use with the same flags
    jit: JitView
    attempts: dict  # mode -> ExportAttempt
    findings: list  # every problem of either mode, each once
    seconds: float

    @property
    def exportable(self) -> bool:
        return self.attempts[self.mode].ok

    @property
    def hint(self) -> str | None:
        """When only the other mode works, switching mode is the cheapest fix."""
        if self.exportable:
            return None
        if self.mode == NON_STRICT and self.attempts[STRICT].ok:
            return "`aotc export --strict` accepts the model as it is"
        if self.mode == STRICT and self.attempts[NON_STRICT].ok:
            return "`aotc export` without --strict accepts the model as it is"
        return None

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "inputs": self.inputs,
            "mode": self.mode,
            "exportable": self.exportable,
            "hint": self.hint,
            "jit": self.jit.to_dict(),
            "export": {mode: attempt.to_dict() for mode, attempt in self.attempts.items()},
            "problems": [f.to_dict() for f in self.findings],
            "seconds": round(self.seconds, 3),
        }


def explain_model(cfg: ExplainConfig) -> ExplainReport:
    cfg.validate()
    started = time.perf_counter()
    import torch

    loaded, call, _task = prepare_model(cfg.export_config())
    with torch.no_grad(), user_output_hidden():
        # A model that fails by itself is a ModelError, not an export problem.
        layout = output_layout(check_eager(loaded, call))
    # The module export traces: the model called with its keyword inputs, its outputs flattened.
    module = flat_module(loaded, call, layout)
    inputs, shapes, dims = call.tensors, call.shapes, call.dims
    jit = jit_view(module, inputs, loaded.source_files)
    attempts = {
        mode: export_attempt(loaded, module, inputs, shapes, dims, mode == STRICT)
        for mode in (NON_STRICT, STRICT)
    }
    findings = []
    for mode, attempt in attempts.items():
        for problem in attempt.problems:
            _merge(findings, Finding(replace(problem), [mode]))
    mode = STRICT if cfg.strict else NON_STRICT
    return ExplainReport(
        loaded.description,
        _describe(call),
        mode,
        jit,
        attempts,
        findings,
        time.perf_counter() - started,
    )


def export_attempt(
    loaded: LoadedModel, module, inputs, shapes, dims, strict: bool
) -> ExportAttempt:
    """torch.export in one mode; on failure, the error's problem plus every one draft_export finds."""
    started = time.perf_counter()
    try:
        with user_output_hidden():
            export_program(loaded, module, inputs, shapes, dims, strict)
        return ExportAttempt(
            STRICT if strict else NON_STRICT, True, [], time.perf_counter() - started
        )
    except ExportError as err:  # export_program wraps torch's exception; the original is the cause
        exc = err.__cause__ or err
    findings = [Finding(diagnose(exc, loaded.source_files, dims, shapes), [])]
    for problem in draft_problems(loaded, module, inputs, shapes, dims, strict):
        _merge(findings, Finding(problem, []))
    problems = [f.problem for f in findings]
    return ExportAttempt(
        STRICT if strict else NON_STRICT, False, problems, time.perf_counter() - started
    )


def draft_problems(loaded: LoadedModel, module, inputs, shapes, dims, strict: bool) -> list:
    """torch.export.draft_export records each problem and traces on, so several show up at once."""
    import torch
    from torch._logging import structured

    with tempfile.TemporaryDirectory() as trace_dir, env_set(TORCH_DTRACE=trace_dir):
        # TORCH_DTRACE: draft_export's trace log goes to a folder deleted after, not /tmp/export_<user>.
        try:
            with quiet_torch(), user_output_hidden():
                ep = torch.export.draft_export(
                    module,
                    tuple(inputs),
                    dynamic_shapes=export_dynamic_shapes(shapes, dims),
                    strict=strict,
                )
        except Exception:  # it stops at the same error: the first problem is all there is
            return []
    report = getattr(ep, "_report", None)
    if report is None:
        return []
    # Frames name files by an id interned once per process, so earlier runs' ids come from the table.
    filenames = {number: name for name, number in structured.INTERN_TABLE.items()}
    filenames.update(report.str_to_filename)
    problems = (
        draft_failure_problem(f, filenames, loaded.source_files)
        for f in report.failures
        if not f.xfail
    )
    return [p for p in problems if p is not None]


def _describe(call) -> list:
    from aotc_runtime import DTYPE_NAMES

    return [
        {
            "name": name,
            "shape": list(shape),
            "example": list(t.shape),
            "dtype": DTYPE_NAMES.get(t.dtype, str(t.dtype)),
        }
        for name, t, shape in zip(call.names, call.tensors, call.shapes)
    ]


def _merge(findings: list, new: Finding) -> None:
    """Add a finding unless it repeats one: same kind at the same line, or one side has no line yet."""
    for old in findings:
        a, b = old.problem, new.problem
        same_place = (
            a.where is None
            or b.where is None
            or (a.where.file, a.where.line) == (b.where.file, b.where.line)
        )
        if a.kind == b.kind and same_place:
            a.where = a.where or b.where
            a.flags = a.flags or b.flags
            old.modes += [m for m in new.modes if m not in old.modes]
            return
    findings.append(new)
