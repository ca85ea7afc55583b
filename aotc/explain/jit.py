"""The JIT view of `aotc explain`: where TorchDynamo (torch.compile's tracer) splits the model, and why.

torch._dynamo.explain runs the model once through TorchDynamo with a backend that keeps every
captured FX graph; each graph break ends one graph and starts the next, and Python runs in between.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass, field

from aotc.export.problems import Problem, classify
from aotc.export.user_frames import Location, first_line, is_user_file, location
from aotc.quiet import quiet_torch, verbose


@dataclass
class GraphBreak:
    problem: Problem  # kind, plain reason, fix, the user's file:line
    torch_reason: str  # torch's own first line, for searching its docs
    inside: Location | None = None  # the innermost frame, when it lies in library code (e.g. scipy)

    def to_dict(self) -> dict:
        return {
            **self.problem.to_dict(),
            "torch_reason": self.torch_reason,
            "inside": self.inside.to_dict() if self.inside else None,
        }


@dataclass
class CapturedGraph:
    ops: list  # readable op names in order: torch.abs, operator.add, Tensor.sum...
    table: list  # rows (opcode, name, target, args), what gm.graph.print_tabular() shows

    def to_dict(self) -> dict:
        return {
            "ops": self.ops,
            "table": [dict(zip(("opcode", "name", "target", "args"), row)) for row in self.table],
        }


@dataclass
class JitView:
    graph_count: int = 0
    breaks: list = field(default_factory=list)
    graphs: list = field(default_factory=list)
    error: str | None = None  # torch._dynamo.explain itself failed

    @property
    def break_count(self) -> int:
        return len(self.breaks)

    def to_dict(self) -> dict:
        return {
            "graph_count": self.graph_count,
            "graph_break_count": self.break_count,
            "error": self.error,
            "breaks": [b.to_dict() for b in self.breaks],
            "graphs": [g.to_dict() for g in self.graphs],
        }


@contextlib.contextmanager
def user_output_hidden():
    """The model's own print()s go to stderr with --verbose, nowhere otherwise: stdout is for the report."""
    with contextlib.redirect_stdout(sys.stderr if verbose() else io.StringIO()):
        yield


def jit_view(module, inputs, user_files=()) -> JitView:
    """Run the model once under torch._dynamo.explain and describe its graphs and graph breaks."""
    import torch

    try:
        with quiet_torch(), user_output_hidden(), torch.no_grad():
            out = torch._dynamo.explain(module)(*inputs)
    except Exception as exc:  # explain gives up on some models; the export view still runs
        return JitView(error=f"{type(exc).__name__}: {first_line(exc)}")
    breaks = [_graph_break(reason, user_files) for reason in out.break_reasons]
    return JitView(out.graph_count, breaks, [_captured(gm) for gm in out.graphs])


def _graph_break(reason, user_files) -> GraphBreak:
    stack = list(reason.user_stack or [])
    where = None
    for frame in stack:
        if is_user_file(frame.filename, user_files):
            where = location(frame.filename, frame.lineno)
    inside = location(stack[-1].filename, stack[-1].lineno) if stack else None
    if inside == where:
        inside = None
    text = str(reason.reason)
    title = text.strip().splitlines()[0] if text.strip() else "graph break"
    # The library frame's source helps classify a break deep inside, say, scipy.
    problem = classify(text, where or inside, title)
    problem.where = where
    return GraphBreak(problem, title, inside)


def _captured(gm) -> CapturedGraph:
    ops, table = [], []
    for node in gm.graph.nodes:
        target = target_name(node)
        if node.op in ("call_function", "call_method", "call_module"):
            ops.append(target)
        args = ", ".join([str(a) for a in node.args] + [f"{k}={v}" for k, v in node.kwargs.items()])
        table.append([node.op, node.name, target, args])
    return CapturedGraph(ops, table)


def target_name(node) -> str:
    """`torch.abs`, `operator.add`, `Tensor.sum`: names a user recognises, not `<built-in method ...>`."""
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op != "call_function":
        return str(node.target)
    from torch.fx.node import _get_qualified_name

    try:
        name = _get_qualified_name(node.target)
    except Exception:  # wrapped callables (e.g. numpy shims) have no importable name
        name = getattr(node.target, "__name__", None) or str(node.target)
    for internal, public in (
        ("_operator.", "operator."),
        ("torch._C._nn.", "torch.nn.functional."),
        ("torch._C._VariableFunctions.", "torch."),
    ):
        if name.startswith(internal):
            return public + name[len(internal) :]
    return name
