"""Turn torch.export / TorchDynamo failures into problems a user can act on.

Each Problem names the user's file:line and source line, the reason in plain words, and a
concrete fix (with the exact `--dim`/`--input-shape` flags where torch suggests a Dim change).
`aotc export` shows the first problems; `aotc explain` shows them all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .user_frames import Location, first_line, innermost_user_frame, is_user_file, location

_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_SUGGESTED = re.compile(r"^\s*(\w+)\s*=\s*(.+?)\s*$")


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
            "kind": self.kind, "reason": self.reason, "fix": self.fix, "flags": self.flags,
            "where": self.where.to_dict() if self.where else None,
        }


def locate(exc: BaseException, user_files) -> Location | None:
    """The user's frame: from the text torch prints (`File "...", line N`) or else the traceback."""
    found = None
    for match in _FILE_LINE.finditer(str(exc)):
        if is_user_file(match.group(1), user_files):
            found = location(match.group(1), int(match.group(2)))
    return found or innermost_user_frame(exc, user_files)


def diagnose(exc: BaseException, user_files=(), dims=None) -> Problem:
    """Classify one export failure. `dims` maps dim names to DimSpec (for flag suggestions)."""
    text = str(exc)
    where = locate(exc, user_files)
    source = where.source if where else ""
    if "Suggested fixes:" in text or "Constraints violated" in text:
        return _constraint_problem(text, where, dims or {})
    if _is_data_dependent(exc, text):
        if re.match(r"^(if|elif|while|assert)\b", source) or "branching" in text:
            return Problem(
                "data-dependent control flow",
                "the branch depends on the values inside a tensor, which torch.export cannot capture in one graph",
                "express both branches with torch.cond(pred, true_fn, false_fn, (x,)), make the branch branchless "
                "(torch.where / clamp), or move the decision out of forward so it does not depend on tensor values",
                where,
            )
        return Problem(
            "data-dependent shape",
            "a size or index is computed from tensor values (e.g. .item() or nonzero), so export cannot know it",
            "tell export its bounds with torch._check(n >= 1) / torch._check(n <= MAX) right after computing it, "
            "or pass that size in as an input dim with a Dim range (--dim)",
            where,
        )
    if _is_non_torch_call(text, source):
        return Problem(
            "non-PyTorch call",
            "the model converts a tensor to NumPy or calls a non-PyTorch library, which export cannot trace",
            "use the torch equivalent (e.g. torch.fft for scipy.fft) or wrap the call as a custom op (torch.library.custom_op)",
            where,
        )
    return Problem("export failed", f"{type(exc).__name__}: {first_line(exc)}", "see `aotc explain` for the full report; rerun with --verbose for torch's traceback", where)


def _is_data_dependent(exc, text: str) -> bool:
    names = {type(e).__name__ for e in _chain(exc)}
    return bool(names & {"GuardOnDataDependentSymNode", "DataDependentOutputException"}) or any(
        marker in text for marker in ("data-dependent", "Data-dependent", "data dependent")
    )


def _is_non_torch_call(text: str, source: str) -> bool:
    return any(marker in text or marker in source for marker in (".numpy()", "numpy", "scipy", "non-Tensor", "FakeTensor"))


def _chain(exc):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def _constraint_problem(text: str, where, dims: dict) -> Problem:
    suggestions = _suggested_fixes(text)
    flags, plain = [], []
    for name, value in suggestions:
        if re.fullmatch(r"\d+", value):
            plain.append(f"the model fixes {name} to {value}: write {value} instead of {name} in --input-shape (a static size)")
            flags.append(f"(replace {name} by {value} in --input-shape, drop --dim {name})")
            continue
        low = re.search(r"min\s*=\s*(\d+)", value)
        high = re.search(r"max\s*=\s*(\d+)", value)
        current = dims.get(name)
        new_low = int(low.group(1)) if low else (current.min if current else 1)
        new_high = int(high.group(1)) if high else (current.max if current else new_low)
        plain.append(f"the model only works for {name} in {new_low}..{new_high}: narrow the range")
        flags.append(f"--dim {name}={new_low}:{new_high}")
    reason = "the model constrains a dim declared dynamic"
    detail = re.search(r"-\s*(.+?)(?:\n|$)", text)
    if detail:
        reason += f" ({detail.group(1).split('. If you')[0].strip()})"
    fix = "; ".join(plain) if plain else "make the dim static, or rewrite the op that specializes it (e.g. view(x.shape[0], -1) instead of view(16, -1))"
    if plain and any("static" in p for p in plain):
        fix += "; or keep it dynamic by rewriting the op that fixes the size (e.g. x.view(x.shape[0], -1) instead of x.view(16, -1))"
    return Problem("dynamic dim specialized", reason, fix, where, flags)


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
