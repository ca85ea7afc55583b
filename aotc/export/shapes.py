"""Input shapes on the command line: "16x3x128x128", "Bx128" with "--dim B=1:64[:16]".

Parsing here is pure (no torch), so the CLI can reject a typo before importing anything heavy.
A dim is a positive int (static) or a name (dynamic, its range given by --dim). The same name in
two inputs is the same size. A shape may name the keyword input it is for: "input_ids=8x128".
With the model file's own example_inputs(), a --dim says which axes it makes dynamic instead:
"B=1:32@input_ids:0,attention_mask:0" (input by name or position, then the axis).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_EXAMPLE = 16  # example size of a dynamic dim without one, clamped into its range
# The largest size a package may declare (aotc_runtime/signature.py refuses a manifest with more).
# Checked here so that a huge number is the flag's one-line error, not int()'s own ValueError
# ("Exceeds the limit (4300 digits)") or a package the runtime then refuses.
MAX_SIZE = 2**31 - 1
# Messages quote what the user wrote with repr(): a line break in a flag must not split the one-line error.


@dataclass(frozen=True)
class DimSpec:
    name: str
    min: int
    max: int
    example: int | None = None
    targets: tuple = ()  # ((input name or position, axis), ...) from "@input:axis,...": dims of example_inputs()

    def example_size(self) -> int:
        if self.example is not None:
            return self.example
        # torch.export specializes sizes 0 and 1, so the traced example must be at least 2.
        return max(2, min(self.max, max(self.min, DEFAULT_EXAMPLE)))

    def to_dict(self) -> dict:
        return {"min": self.min, "max": self.max, "example": self.example_size()}

    def flag(self, low: int | None = None, high: int | None = None) -> str:
        """This dim as the --dim flag that declares it, with another range if given."""
        at = (
            "@" + ",".join(f"{target}:{axis}" for target, axis in self.targets)
            if self.targets
            else ""
        )
        return f"--dim {self.name}={self.min if low is None else low}:{self.max if high is None else high}{at}"


@dataclass(frozen=True)
class InputShape:
    """One --input-shape: the shape (ints and dim names) and, for a keyword input, its name."""

    name: str | None
    shape: tuple

    def __str__(self) -> str:
        return f"{self.name}={format_shape(self.shape)}" if self.name else format_shape(self.shape)


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
            raise ValueError(
                f"shape {text!r} has an empty dim at position {position}; write e.g. 16x3x128x128"
            )
        if re.fullmatch(r"[+-]?\d+", token):
            size = _size(token, f"shape {text!r}: dim {position}")
            if size < 1:
                raise ValueError(f"shape {text!r}: dim {position} is {size}; sizes must be >= 1")
            dims.append(size)
        elif NAME.match(token):
            dims.append(token)
        else:
            raise ValueError(
                f"shape {text!r}: dim {position} {token!r} is neither a positive integer nor a dim name (like B)"
            )
    return tuple(dims)


def parse_input_shape(text: str) -> InputShape:
    """'16x3x128x128' (the next positional input) or 'input_ids=8x128' (a keyword input)."""
    name, sep, rest = text.partition("=")
    if not sep:
        return InputShape(None, parse_shape(text))
    name = name.strip()
    if not NAME.match(name):
        raise ValueError(
            f"input shape {text!r}: {name!r} is not an input name; write NAME=SHAPE, e.g. input_ids=8x128"
        )
    return InputShape(name, parse_shape(rest))


def as_input_shape(value) -> InputShape:
    """An InputShape from an InputShape or a plain shape tuple (library callers may pass either)."""
    return value if isinstance(value, InputShape) else InputShape(None, tuple(value))


def parse_dim(text: str) -> DimSpec:
    """'B=1:64', 'B=1:64:16' (min:max[:example]), optionally '@input:axis[,input:axis...]'."""
    text, _, at = text.partition("@")
    match = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+):(\d+)(?::(\d+))?\s*", text)
    if not match:
        raise ValueError(
            f"dim {text!r} must look like NAME=MIN:MAX or NAME=MIN:MAX:EXAMPLE, e.g. B=1:64 "
            "(with example_inputs(): B=1:64@input_ids:0)"
        )
    name = match.group(1)
    low, high = _size(match.group(2), f"dim {name}: MIN"), _size(match.group(3), f"dim {name}: MAX")
    example = _size(match.group(4), f"dim {name}: EXAMPLE") if match.group(4) is not None else None
    if low < 1:
        raise ValueError(f"dim {name}: MIN is {low}; sizes must be >= 1")
    if high < low:
        raise ValueError(f"dim {name}: MAX {high} is below MIN {low}")
    if high < 2:
        raise ValueError(
            f"dim {name}={low}:{high} can only be 1; write 1 in the shape instead of {name}"
        )
    if example is not None and not low <= example <= high:
        raise ValueError(f"dim {name}: example size {example} is outside its range {low}:{high}")
    if example is not None and example < 2:
        raise ValueError(
            f"dim {name}: example size {example} would be specialized by torch.export; use an example >= 2"
        )
    return DimSpec(name, low, high, example, _parse_targets(name, at) if at else ())


def _size(token: str, what: str) -> int:
    """int(token) of [+-]digits; above MAX_SIZE (either sign) refused before int() sees 4300 digits."""
    digits = token.lstrip("+-").lstrip("0")
    if len(digits) > len(str(MAX_SIZE)) or int(digits or "0") > MAX_SIZE:
        shown = token if len(token) <= 20 else token[:17] + "..."
        raise ValueError(f"{what} is {shown}; sizes must be between 1 and {MAX_SIZE}")
    return int(token)


def _parse_targets(name: str, text: str) -> tuple:
    """'input_ids:0,attention_mask:0' -> (('input_ids', 0), ('attention_mask', 0)); '0:1' -> ((0, 1),)."""
    targets = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*|\d+)\s*:\s*(\d+)\s*", item)
        if not match:
            raise ValueError(
                f"dim {name}: {'@' + text!r} must list INPUT:AXIS pairs, e.g. @input_ids:0,attention_mask:0"
            )
        target = int(match.group(1)) if match.group(1).isdigit() else match.group(1)
        targets.append((target, int(match.group(2))))
    return tuple(targets)


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
        problems.append(
            f"shape dim '{name}' has no range: pass --dim {name}=MIN:MAX (or write a number)"
        )
    for name in sorted(set(by_name) - used):
        problems.append(f"--dim {name} names no dim of any --input-shape")
    if problems:
        from aotc.errors import UserInputError

        raise UserInputError("; ".join(problems))
    return by_name


def export_dynamic_shapes(shapes, dims: dict, extra_static: int = 0):
    """torch.export's dynamic_shapes for a module called as forward(*flat) (see aotc/export/call_structure.py).

    One dict {axis: Dim} per input, None for a static one; `extra_static` more Nones for inputs
    that are always static (state carried between calls). None when nothing is dynamic.
    """
    import torch

    if not dims:
        return None
    export_dims = {name: torch.export.Dim(name, min=d.min, max=d.max) for name, d in dims.items()}
    per_input = [
        {axis: export_dims[e] for axis, e in enumerate(shape) if isinstance(e, str)} or None
        for shape in shapes
    ]
    return (tuple(per_input + [None] * extra_static),)


def signature_dynamic_shapes(signature: dict):
    """The artifact's dynamic_shapes again, from its signature (state inputs are static): for a
    program exported once more (placed in a reduced precision, or returning its state for ONNX)."""
    dims = {
        name: DimSpec(name, info["min"], info["max"])
        for name, info in (signature.get("dims") or {}).items()
    }
    shapes = [spec["shape"] for spec in signature["inputs"]]
    return export_dynamic_shapes(shapes, dims, extra_static=len(signature.get("state", ())))


def format_shape(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"
