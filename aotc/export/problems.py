"""Turn torch.export / TorchDynamo failures into problems a user can act on.

Each Problem names the user's file:line and source line, the reason in plain words, and a
concrete fix (with the exact `--dim`/`--input-shape` flags where torch suggests a Dim change).
`aotc export` shows the first problem on one line; `aotc explain` shows them all. The same rules
classify an export exception, a TorchDynamo graph-break reason and a draft_export failure, so a
problem reads the same whichever tool found it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from aotc.export.user_frames import (
    Location,
    first_line,
    innermost_user_frame,
    is_user_file,
    location,
)

_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_SUGGESTED = re.compile(r"^\s*(\w+)\s*=\s*(.+?)\s*$")

CONTROL_FLOW = "data-dependent control flow"
DATA_SHAPE = "data-dependent shape"
NON_TORCH = "non-PyTorch call"
DIM_SPECIALIZED = "dynamic dim specialized"


@dataclass
class Problem:
    kind: str
    reason: str
    fix: str
    where: Location | None = None
    flags: list = field(default_factory=list)

    def render(self) -> str:
        head = f"{self.where}: " if self.where else ""
        text = f"{head}{self.kind}: {self.reason}\n    fix: {self.fix}"
        if self.flags:
            text += "\n    flags: " + " ".join(self.flags)
        return text

    def one_line(self) -> str:
        head = f"{self.where}: " if self.where else ""
        flags = f" (flags: {' '.join(self.flags)})" if self.flags else ""
        return f"{head}{self.kind}: {self.reason}; fix: {self.fix}{flags}"

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "fix": self.fix,
            "flags": self.flags,
            "where": self.where.to_dict() if self.where else None,
        }


_CONTROL_FLOW = (
    CONTROL_FLOW,
    "the code branches on a value inside a tensor, which cannot be captured in one graph",
    "express both branches with torch.cond(pred, true_fn, false_fn, (x,)), make the branch branchless "
    "(torch.where / clamp), or move the decision out of forward; if the condition is on a size read with "
    ".item(), state its bounds with torch._check(...) before the if",
)

# What TorchDynamo / torch.export say (any marker, in the message or the user's source line)
# -> (kind, reason in plain words, fix). First match wins, so specific rules come first.
_RULES = (
    (
        ("torch.compiler.disable", "compiler.disable()"),
        (
            "compiler-disabled call",
            "the code calls a function wrapped in torch.compiler.disable, which TorchDynamo must not trace: "
            "it runs eagerly between two graphs",
            "remove @torch.compiler.disable from the helper if its body is plain PyTorch; otherwise keep it out of "
            "forward (non-strict export, `aotc export`'s default, traces through it)",
        ),
    ),
    (
        ("builtin operator `print`", "print("),
        (
            "print in forward",
            "print() has a side effect TorchDynamo cannot put in a graph, so it splits the graph around it",
            "remove the print from forward (log outside the model), or for torch.compile add print to "
            "torch._dynamo.config.reorderable_logging_functions",
        ),
    ),
    (
        (
            ".numpy()",
            "numpy",
            "ndarray",
            "scipy",
            "Dynamo does not know how to trace the builtin",
            "non-Tensor",
        ),
        (
            NON_TORCH,
            "the model hands a tensor to NumPy/SciPy or another non-PyTorch library, which no graph can contain",
            "use the torch equivalent (torch.fft for scipy.fft, torch.linalg for numpy.linalg...) or wrap the call "
            "as a custom op with torch.library.custom_op and register a fake (shape) kernel for it",
        ),
    ),
    (("Data-dependent branching", "generic_jump"), _CONTROL_FLOW),
    (
        ("Tensor.item()", ".item()", ".tolist()"),
        (
            "scalar read from a tensor",
            "the code reads a Python number out of a tensor (.item()), which TorchDynamo breaks the "
            "graph on by default",
            "keep the value in a tensor if you can; for torch.compile set "
            "torch._dynamo.config.capture_scalar_outputs = "
            "True; torch.export captures it (bound it with torch._check(n >= 0) if export then asks)",
        ),
    ),
)


def diagnose(exc: BaseException, user_files=(), dims=None, shapes=None) -> Problem:
    """Classify one export failure.

    `dims` maps dim names to DimSpec and `shapes` are the --input-shape tuples: with both, a Dim fix
    is given as the complete shape flags to pass instead of the old ones.
    """
    text = str(exc)
    where = locate(exc, user_files)
    if "Suggested fixes:" in text or "Constraints violated" in text:
        problem = _constraint_problem(text, where, dims or {})
        if shapes is not None and problem.flags:
            problem.flags = fixed_shape_flags(text, shapes, dims or {})
        return problem
    if _is_data_dependent(exc, text):
        return data_dependent_problem(text, where)
    return classify(text, where, f"{type(exc).__name__}: {first_line(exc)}")


def classify(text: str, where: Location | None, fallback: str) -> Problem:
    """A TorchDynamo/torch.export message (plus the user's source line) -> a Problem."""
    source = where.source if where else ""
    for markers, (kind, reason, fix) in _RULES:
        if any(marker in text or marker in source for marker in markers):
            return Problem(kind, reason, fix, where)
    hint = re.search(r"Hint: (.+)", text)
    fix = hint.group(1).strip() if hint else "rerun with --verbose for torch's full message"
    return Problem("unsupported code", fallback, fix, where)


def data_dependent_problem(text: str, where: Location | None) -> Problem:
    """A guard on a value only known at run time: a branch (control flow) or a size (shape)."""
    source = where.source if where else ""
    if re.match(r"^(if|elif|while|assert)\b", source) or "branching" in text:
        return Problem(*_CONTROL_FLOW, where)
    if "specialized integer" in text:
        return Problem(
            DATA_SHAPE,
            "a size read from tensor values is turned into a plain Python int (int(), range(), a list length), "
            "so export would have to know it while tracing",
            "keep it symbolic: use the .item() result directly (torch.ones(n) works) instead of int(...)/range(...), "
            "bound it with torch._check(n >= 0) / torch._check(n <= MAX), or pass the size in as the shape of an "
            "input with a Dim range (--dim)",
            where,
        )
    return Problem(
        DATA_SHAPE,
        "a size or index is computed from tensor values (e.g. .item() or nonzero), so export cannot know it",
        "tell export its bounds with torch._check(n >= 1) / torch._check(n <= MAX) right after computing it, "
        "or pass that size in as an input dim with a Dim range (--dim)",
        where,
    )


def locate(exc: BaseException, user_files) -> Location | None:
    """The user's frame: from the text torch prints (`File "...", line N`) or else the traceback."""
    found = None
    for match in _FILE_LINE.finditer(str(exc)):
        if is_user_file(match.group(1), user_files):
            found = location(match.group(1), int(match.group(2)))
    return found or innermost_user_frame(exc, user_files)


def _is_data_dependent(exc, text: str) -> bool:
    names = {type(e).__name__ for e in _chain(exc)}
    if names & {"GuardOnDataDependentSymNode", "DataDependentOutputException"}:
        return True
    if "Data-dependent branching" in text:
        return False  # strict mode's graph-break message: classify() has a rule for it
    return any(marker in text for marker in ("data-dependent", "Data-dependent", "data dependent"))


def _chain(exc):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def _constraint_problem(text: str, where, dims: dict) -> Problem:
    suggestions = dict(_suggested_fixes(text))
    flags, plain = [], []
    for name, value in suggestions.items():
        if name.startswith("_"):
            continue  # a helper dim torch introduced for a derived one; explained with that dim below
        flag, advice = _suggestion_flag(name, value, suggestions, dims)
        plain.append(advice)
        if flag:
            flags.append(flag)
    reason = "the model constrains a dim declared dynamic"
    detail = re.search(r"-\s*(.+?)(?:\n|$)", text)
    if detail:
        reason += f" ({detail.group(1).split('. If you')[0].strip()})"
    fix = (
        "; ".join(plain)
        if plain
        else "make the dim static, or rewrite the op that specializes it "
        "(e.g. view(x.shape[0], -1) instead of view(16, -1))"
    )
    if any(re.fullmatch(r"\d+", value) for value in suggestions.values()):
        fix += (
            "; or keep it dynamic by rewriting the op that fixes the size "
            "(e.g. x.view(x.shape[0], -1) instead of x.view(16, -1))"
        )
    return Problem(DIM_SPECIALIZED, reason, fix, where, flags)


def _suggestion_flag(name: str, value: str, suggestions: dict, dims: dict):
    """One torch suggestion (`B = 16`, `B = Dim('B', max=32)`, `B = 2*_B`) -> (flag or None, advice)."""
    if re.fullmatch(r"\d+", value):
        return (
            f"(replace {name} by {value} in --input-shape, drop --dim {name})",
            f"the model fixes {name} to {value}: write {value} instead of {name} in --input-shape (a static size)",
        )
    derived = re.fullmatch(r"(\d+)\s*\*\s*(_?\w+)", value)
    if derived:
        factor, helper = derived.groups()
        return (
            None,
            f"the model needs {name} to be a multiple of {factor} ({name} = {value}, {helper} from "
            f"{suggestions.get(helper, 'a Dim')}): aotc's --dim cannot express that, so make {name} static "
            f"(a multiple of {factor} in --input-shape) or change the op that needs it",
        )
    current = dims.get(name)
    low = re.search(r"min\s*=\s*(\d+)", value)
    high = re.search(r"max\s*=\s*(\d+)", value)
    new_low = int(low.group(1)) if low else (current.min if current else 1)
    new_high = int(high.group(1)) if high else (current.max if current else new_low)
    flag = current.flag(new_low, new_high) if current else f"--dim {name}={new_low}:{new_high}"
    return flag, f"the model only works for {name} in {new_low}..{new_high}: narrow the range"


def _suggested_fixes(text: str) -> list:
    if "Suggested fixes:" not in text:
        return []
    found = []
    for line in text.split("Suggested fixes:", 1)[1].splitlines()[1:]:
        if not line.strip():
            break
        match = _SUGGESTED.match(line)
        if match:
            found.append((match.group(1), match.group(2)))
    return found


def draft_failure_problem(failure, filenames: dict, user_files=()) -> Problem | None:
    """One torch.export.draft_export FailureReport -> a Problem (None for kinds aotc cannot act on)."""
    kind = getattr(failure.failure_type, "name", str(failure.failure_type))
    data = failure.data
    where = _draft_location(data.get("user_stack") or [], filenames, user_files)
    if kind == "DATA_DEPENDENT_ERROR":
        return data_dependent_problem(str(data.get("expr", "")), where)
    if kind == "GUARD_ADDED":
        problem = _constraint_problem("", where, {})
        problem.reason = f"the model adds the guard {data.get('expr')} on a dim declared dynamic"
        return problem
    if kind in ("MISSING_FAKE_KERNEL", "MISMATCHED_FAKE_KERNEL"):
        op = data.get("op", "a custom op")
        return Problem(
            "custom op without a fake kernel",
            f"torch.ops.{op} has no (or a wrong) fake kernel, so export "
            "cannot know its output shapes",
            f"register one with @torch.library.register_fake('{op}')",
            where,
        )
    return None


def _draft_location(stack: list, filenames: dict, user_files) -> Location | None:
    """draft_export keeps frames as {filename: interned id, line}; the innermost user one wins."""
    found = None
    for frame in stack:
        name = filenames.get(frame.get("filename"))
        if name and is_user_file(name, user_files):
            found = location(name, int(frame["line"]))
    return found


def fixed_shape_flags(text: str, shapes, dims: dict) -> list:
    """torch's suggested fixes applied to the user's shape flags: every --input-shape and --dim to pass.

    Dims declared with @input:axis name axes of example_inputs(): those models take no --input-shape,
    so only the --dim flags are given.
    """
    from aotc.export.shapes import format_shape

    suggestions = dict(_suggested_fixes(text))
    static = {
        name: int(value) for name, value in suggestions.items() if re.fullmatch(r"\d+", value)
    }
    from_examples = any(dim.targets for dim in dims.values())
    flags = (
        []
        if from_examples
        else [
            f"--input-shape {format_shape(tuple(static.get(e, e) for e in shape))}"
            for shape in shapes
        ]
    )
    for name, dim in dims.items():
        if name in static:
            continue
        flag, _ = (
            _suggestion_flag(name, suggestions[name], suggestions, dims)
            if name in suggestions
            else (None, "")
        )
        flags.append(flag if flag and flag.startswith("--dim") else dim.flag())
    return flags
