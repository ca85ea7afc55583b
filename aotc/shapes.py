"""Input shapes on the command line: "16x3x128x128", "Bx128" with "--dim B=1:64[:16]".

Parsing here is pure (no torch), so the CLI can reject a typo before importing anything heavy.
A dim is a positive int (static) or a name (dynamic, its range given by --dim). The same name in
two inputs is the same size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_EXAMPLE = 16  # example size of a dynamic dim without one, clamped into its range


@dataclass(frozen=True)
class DimSpec:
    name: str
    min: int
    max: int
    example: int | None = None

    def example_size(self) -> int:
        if self.example is not None:
            return self.example
        # torch.export specializes sizes 0 and 1, so the traced example must be at least 2.
        return max(2, min(self.max, max(self.min, DEFAULT_EXAMPLE)))

    def to_dict(self) -> dict:
        return {"min": self.min, "max": self.max, "example": self.example_size()}


def parse_shape(text: str) -> tuple:
    """'16x3x128x128' -> (16, 3, 128, 128); 'Bx128' -> ('B', 128). ValueError says what is wrong."""
    text = text.strip()
    if not text:
        raise ValueError("empty shape; write dims separated by 'x', e.g. 16x3x128x128")
    if text.lower() in ("scalar", "()"):
        return ()
    dims = []
    for position, token in enumerate(text.split("x"), start=1):
        token = token.strip()
        if token == "":
            raise ValueError(f"shape '{text}' has an empty dim at position {position}; write e.g. 16x3x128x128")
        if re.fullmatch(r"[+-]?\d+", token):
            size = int(token)
            if size < 1:
                raise ValueError(f"shape '{text}': dim {position} is {size}; sizes must be >= 1")
            dims.append(size)
        elif NAME.match(token):
            dims.append(token)
        else:
            raise ValueError(f"shape '{text}': dim {position} '{token}' is neither a positive integer nor a dim name (like B)")
    return tuple(dims)


def parse_dim(text: str) -> DimSpec:
    """'B=1:64' or 'B=1:64:16' (min:max[:example])."""
    match = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+):(\d+)(?::(\d+))?\s*", text)
    if not match:
        raise ValueError(f"dim '{text}' must look like NAME=MIN:MAX or NAME=MIN:MAX:EXAMPLE, e.g. B=1:64")
    name, low, high, example = match.group(1), int(match.group(2)), int(match.group(3)), match.group(4)
    example = int(example) if example is not None else None
    if low < 1:
        raise ValueError(f"dim {name}: MIN is {low}; sizes must be >= 1")
    if high < low:
        raise ValueError(f"dim {name}: MAX {high} is below MIN {low}")
    if high < 2:
        raise ValueError(f"dim {name}={low}:{high} can only be 1; write 1 in the shape instead of {name}")
    if example is not None and not low <= example <= high:
        raise ValueError(f"dim {name}: example size {example} is outside its range {low}:{high}")
    if example is not None and example < 2:
        raise ValueError(f"dim {name}: example size {example} would be specialized by torch.export; use an example >= 2")
    return DimSpec(name, low, high, example)


def resolve_dims(shapes: list, dims: list) -> dict:
    """Check that every named dim has exactly one --dim and every --dim is used; return name -> DimSpec."""
    by_name: dict[str, DimSpec] = {}
    problems = []
    for dim in dims:
        if dim.name in by_name:
            problems.append(f"--dim {dim.name} is given twice")
        by_name[dim.name] = dim
    used = {entry for shape in shapes for entry in shape if isinstance(entry, str)}
    for name in sorted(used - set(by_name)):
        problems.append(f"shape dim '{name}' has no range: pass --dim {name}=MIN:MAX (or write a number)")
    for name in sorted(set(by_name) - used):
        problems.append(f"--dim {name} names no dim of any --input-shape")
    if problems:
        from .errors import UserInputError

        raise UserInputError("; ".join(problems))
    return by_name


def format_shape(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"
