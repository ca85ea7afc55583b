"""The example call export traces: which tensors go in, under which names, and which dims are dynamic.

From the flags: `--input-shape 16x3x224x224` (the next positional input) or
`--input-shape input_ids=8x128` (a keyword input), random tensors of `--dtype`, dims named in the
shapes. From the model file's `example_inputs()`: a tensor, a tuple of tensors (positional), a dict
(keyword inputs; bool/int/float/str/None values are passed as constants and baked into the
program), or a pair (tuple, dict); `--dim NAME=MIN:MAX@input:axis,...` makes axes of those
tensors dynamic.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace

from aotc.errors import ModelError, UserInputError
from aotc.export.call_structure import CONSTANT_TYPES
from aotc.export.shapes import DimSpec, as_input_shape, resolve_dims
from aotc.export.user_frames import first_line, innermost_user_frame


@dataclass
class ExampleCall:
    tensors: list  # flat: positional inputs, then keyword inputs
    names: list  # one per tensor
    n_positional: int
    shapes: list  # per tensor: ints and dim names
    dims: dict  # name -> DimSpec (example = the traced size)
    constants: dict = field(default_factory=dict)  # non-tensor keyword inputs, baked in

    @property
    def keywords(self) -> tuple:
        return tuple(self.names[self.n_positional :])


def positional_names(module, count: int) -> list:
    """Names of the first `count` positional parameters of forward (input_0... past a *args)."""
    # FunctionModule wraps a plain function
    target = getattr(module, "function", None) or module.forward
    try:
        params = [
            p
            for p in inspect.signature(target).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    return [params[i].name if i < len(params) else f"input_{i}" for i in range(count)]


def example_call(cfg, loaded) -> ExampleCall:
    if cfg.input_shapes:
        return _from_flags(cfg, loaded)
    if loaded.example_inputs is None:
        raise UserInputError(
            f"{loaded.description}: no inputs given; pass --input-shape (one per input, NAME=SHAPE for "
            "keyword inputs) or define example_inputs() in the model file"
        )
    return _from_example_inputs(cfg, loaded)


def _from_flags(cfg, loaded) -> ExampleCall:
    import torch

    from aotc_runtime import random_tensor

    if any(d.targets for d in cfg.dims):
        raise UserInputError(
            "--dim NAME=MIN:MAX@INPUT:AXIS is for dims of example_inputs(); with --input-shape write "
            "the dim's name in the shape instead (e.g. --input-shape Bx128 --dim B=1:64)"
        )
    given = [as_input_shape(s) for s in cfg.input_shapes]
    named = [s.name for s in given if s.name]
    if len(set(named)) != len(named):
        raise UserInputError(
            f"--input-shape names an input twice ({', '.join(sorted(n for n in named if named.count(n) > 1))})"
        )
    order = [i for i, s in enumerate(given) if not s.name] + [
        i for i, s in enumerate(given) if s.name
    ]
    shapes = [given[i].shape for i in order]
    dims = resolve_dims(shapes, cfg.dims)
    sizes = {name: dim.example_size() for name, dim in dims.items()}
    generator = torch.Generator().manual_seed(0)
    tensors = [
        random_tensor(
            [e if isinstance(e, int) else sizes[e] for e in shape],
            cfg.dtype_for(i),
            None,
            generator,
        )
        for i, shape in zip(order, shapes)
    ]
    n_positional = len(given) - len(named)
    names = positional_names(loaded.module, n_positional) + [
        given[i].name for i in order[n_positional:]
    ]
    return ExampleCall(tensors, names, n_positional, [tuple(s) for s in shapes], dims)


def _from_example_inputs(cfg, loaded) -> ExampleCall:
    import torch

    try:
        produced = loaded.example_inputs()
    except Exception as exc:
        where = innermost_user_frame(exc, loaded.source_files)
        raise ModelError(
            f"example_inputs() failed at {where}: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    positional, keyword = _split(produced, torch)
    constants = {k: v for k, v in keyword.items() if not isinstance(v, torch.Tensor)}
    bad = [k for k, v in constants.items() if not isinstance(v, CONSTANT_TYPES)]
    if bad or not all(isinstance(t, torch.Tensor) for t in positional):
        what = (
            f"keyword input {bad[0]!r} is a {type(keyword[bad[0]]).__name__}"
            if bad
            else "a positional input is not a tensor"
        )
        raise ModelError(
            f"example_inputs(): {what}; inputs must be tensors (keyword inputs may also be bool, int, float, "
            "str or None, which are baked into the package)"
        )
    tensor_kw = {k: v for k, v in keyword.items() if isinstance(v, torch.Tensor)}
    names = positional_names(loaded.module, len(positional)) + list(tensor_kw)
    tensors = list(positional) + list(tensor_kw.values())
    shapes, dims = _dims_on_examples(cfg.dims, tensors, names)
    return ExampleCall(tensors, names, len(positional), shapes, dims, constants)


def _split(produced, torch):
    """example_inputs()'s result -> (positional list, keyword dict)."""
    if isinstance(produced, torch.Tensor):
        return [produced], {}
    if isinstance(produced, dict):
        return [], dict(produced)
    if isinstance(produced, (tuple, list)):
        if (
            len(produced) == 2
            and isinstance(produced[0], (tuple, list))
            and isinstance(produced[1], dict)
        ):
            return list(produced[0]), dict(produced[1])
        return list(produced), {}
    raise ModelError(
        f"example_inputs() returned a {type(produced).__name__}; return a tensor, a tuple of tensors, "
        "a dict of keyword inputs, or (tuple, dict)"
    )


def _dims_on_examples(dims: tuple, tensors: list, names: list):
    """Apply `--dim NAME=MIN:MAX@input:axis,...` to the example tensors: (shapes with dim names, {name: DimSpec})."""
    shapes = [list(t.shape) for t in tensors]
    resolved = {}
    problems = []
    for dim in dims:
        if not dim.targets:
            problems.append(
                f"--dim {dim.name}: with example_inputs() say which axes it names, e.g. "
                f"--dim {dim.name}={dim.min}:{dim.max}@{names[0] if names else 'x'}:0"
            )
            continue
        if dim.name in resolved:
            problems.append(
                f"--dim {dim.name} is given twice; list all its axes in one flag (@a:0,b:0)"
            )
            continue
        sizes = set()
        for target, axis in dim.targets:
            index = (
                target
                if isinstance(target, int)
                else (names.index(target) if target in names else None)
            )
            if index is None or index >= len(tensors):
                problems.append(
                    f"--dim {dim.name}: no input {target!r} (inputs: {', '.join(names)})"
                )
                continue
            if axis >= len(shapes[index]):
                problems.append(
                    f"--dim {dim.name}: input {names[index]} has {len(shapes[index])} dims, no axis {axis}"
                )
                continue
            sizes.add(int(tensors[index].shape[axis]))
            shapes[index][axis] = dim.name
        if len(sizes) > 1:
            problems.append(
                f"--dim {dim.name} names axes of different sizes {sorted(sizes)} in the examples; one dim is one size"
            )
        elif sizes:
            size = sizes.pop()
            if dim.example is not None and dim.example != size:
                problems.append(
                    f"--dim {dim.name}: example size {dim.example} differs from example_inputs()' size {size}; drop it"
                )
            elif not dim.min <= size <= dim.max:
                problems.append(
                    f"--dim {dim.name}={dim.min}:{dim.max}: example_inputs() has size {size}, outside the range"
                )
            elif size < 2:
                problems.append(
                    f"--dim {dim.name}: example_inputs() has size {size}, which torch.export "
                    "specializes; use an example of 2 or more"
                )
            resolved[dim.name] = replace(dim, example=size)
    if problems:
        raise UserInputError("; ".join(problems))
    return [tuple(s) for s in shapes], resolved


def describe(call: ExampleCall) -> str:
    from aotc.export.shapes import format_shape

    return ", ".join(
        f"{name} {format_shape(tuple(t.shape))} {str(t.dtype).replace('torch.', '')}"
        for name, t in zip(call.names, call.tensors)
    )


__all__ = ["ExampleCall", "example_call", "positional_names", "describe", "DimSpec"]
