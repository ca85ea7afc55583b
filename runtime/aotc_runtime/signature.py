"""The input/output signature a package records, and the checks made on inputs before running.

Manifest form (JSON):
    {"inputs":  [{"name": "x", "dtype": "float32", "shape": ["B", 128], "value_range": null, "keyword": false}],
     "outputs": [{"name": "output_0", "dtype": "float32", "shape": ["B", 10]}],
     "dims":    {"B": {"min": 1, "max": 64, "example": 16}},
     "output_structure": "tensor",          # tensor | tuple | list | dict: what a call returns
     "dropped_outputs": ["past_key_values"], # optional: None entries of the model's output, left out
     "constants": {"return_dict": true},     # optional: non-tensor keyword inputs baked into the program
     "state": [{"name": "count", "dtype": "float32", "shape": [1]}]}  # optional: buffers forward mutates
A shape entry is an int (static) or the name of a dynamic dim; output entries may be expressions
of those names ("2*B"). `value_range` is [low, high] for integer inputs: random inputs are drawn
from it (an embedding's rows for token ids). `keyword` inputs are passed by name to the model; the
package takes every input by position or by name. Output names come from the model's output
structure (`last_hidden_state`, `logits`; `output_0`... for tensors and plain tuples).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .errors import InputMismatchError
from .fields import Fields, shown

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# The value_range an integer input may have: what its dtype holds, high + 1 included (random_tensor).
INT_RANGES = {
    dtype: (torch.iinfo(dtype).min, min(torch.iinfo(dtype).max, 2**63 - 2))
    for dtype in DTYPES.values()
    if not dtype.is_floating_point and dtype != torch.bool
}


SHAPE_PROBLEM = "is not a list of sizes (integers 0 to 2**31-1) and dim names"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple  # ints and dim names (outputs: also expressions of dim names, "2*B")
    value_range: tuple | None = None  # inputs only: [low, high] of integer inputs
    keyword: bool = False  # inputs only: the model takes it by name

    @classmethod
    def read(cls, fields: Fields, is_input: bool = False) -> TensorSpec:
        name = fields.text("name")
        if not name:
            fields.fail("name", "is empty")
        dtype = fields.choice("dtype", tuple(DTYPES))
        shape = fields.value("shape", None)
        if not isinstance(shape, list) or not all(
            _is_size(e) or (isinstance(e, str) and e) for e in shape
        ):
            fields.fail("shape", SHAPE_PROBLEM)
        value_range = fields.value("value_range", None) if is_input else None
        if value_range is not None and not (
            isinstance(value_range, list)
            and len(value_range) == 2
            and all(
                isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63
                for v in value_range
            )
        ):
            fields.fail("value_range", "is not null or [low, high] integers")
        # random_tensor draws integer inputs with torch.randint(low, high + 1, dtype=...): an inverted
        # range, or one the dtype cannot hold (high + 1 past int64 included), failed there instead,
        # `aotc run` ending in a traceback.
        if value_range is not None and DTYPES[dtype] in INT_RANGES:
            smallest, largest = INT_RANGES[DTYPES[dtype]]
            if not smallest <= value_range[0] <= value_range[1] <= largest:
                fields.fail(
                    "value_range",
                    f"is {value_range}, not [low, high] with {smallest} <= low <= high <= {largest}",
                )
        keyword = fields.boolean("keyword", False) if is_input else False
        return cls(name, dtype, tuple(shape), tuple(value_range) if value_range else None, keyword)

    def to_json(self, is_input: bool = False) -> dict:
        data: dict = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if is_input:
            data.update(
                value_range=list(self.value_range) if self.value_range else None,
                keyword=self.keyword,
            )
        return data

    def describe(self, dims: dict) -> str:
        parts = []
        for entry in self.shape:
            if isinstance(entry, int):
                parts.append(str(entry))
            elif entry in dims:
                parts.append(f"{entry}={dims[entry]['min']}..{dims[entry]['max']}")
            else:
                parts.append(str(entry))
        return "[" + ", ".join(parts) + "]"


# Bounds on what a manifest may declare, checked before anything is allocated from it: a size
# above 2**31 - 1 is no size a model serves, and an input of more than 2**32 elements at the
# example sizes (16 GiB of float32) is no input the runtime makes up for `aotc run`.
MAX_SIZE = 2**31 - 1
MAX_EXAMPLE_ELEMENTS = 2**32


def _is_size(value: object, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_SIZE


def _read_dim(parent: Fields, name: str) -> dict:
    fields = parent.object(name)
    info = {key: fields.integer(key) for key in ("min", "max", "example")}
    if info["max"] > MAX_SIZE:
        fields.fail(
            "max", f"is {shown(info['max'])}, above the largest size a runtime accepts ({MAX_SIZE})"
        )
    if not 0 <= info["min"] <= info["example"] <= info["max"]:
        # shown(): str() of an int past 4300 digits raises ValueError
        values = ", ".join(shown(info[key]) for key in ("min", "example", "max"))
        parent.fail(name, f"range is not min <= example <= max ({values})")
    return info


OUTPUT_STRUCTURES = ("tensor", "tuple", "list", "dict")


@dataclass(frozen=True)
class Signature:
    inputs: tuple
    outputs: tuple
    dims: dict = field(default_factory=dict)  # name -> {"min", "max", "example"}
    output_structure: str = ""  # "" in packages from before it was recorded: the call spec decides
    state: tuple = ()  # TensorSpecs of the state carried between calls
    dropped_outputs: tuple = ()
    constants: dict = field(default_factory=dict)
    # True: the program writes the state's new values into its state inputs. False (packages
    # from before 2026-11-26): it returns them after the outputs.
    state_in_place: bool = False

    @classmethod
    def from_json(cls, data: dict | Fields, where: str = "signature") -> Signature:
        """Read and check the manifest's `signature`; FieldError names the first bad field."""
        fields = data if isinstance(data, Fields) else Fields(data, where)
        inputs = fields.items("inputs", lambda f: TensorSpec.read(f, is_input=True))
        outputs = fields.items("outputs", TensorSpec.read)
        dims = fields.mapping("dims", _read_dim, {})
        named = {e for spec in inputs for e in spec.shape if isinstance(e, str)}
        if named - set(dims):
            fields.fail(
                "inputs",
                f"name dims with no range in {fields.path('dims')}: "
                # quoted when they hold a line break, which would split the one-line error
                + ", ".join(n if n.isprintable() else repr(n) for n in sorted(named - set(dims))),
            )
        for index, spec in enumerate(inputs):
            elements = 1
            for entry in spec.shape:
                elements *= entry if isinstance(entry, int) else dims[entry]["example"]
                # Refused at the first factor past the bound, as the C++ runner does: the product of
                # a shape of 500 sizes of 2**31-1 was too long for str() here (ValueError past 4300
                # digits), and that of a million slow to compute.
                if elements > MAX_EXAMPLE_ELEMENTS:
                    fields.fail(
                        f"inputs[{index}].shape",
                        f"declares {elements} elements or more at the example sizes, "
                        "above the runtime's bound of 2**32",
                    )
        structure = fields.choice("output_structure", OUTPUT_STRUCTURES + ("",), "")
        constants = fields.raw_object("constants", {})
        return cls(
            inputs,
            outputs,
            dims,
            structure,
            fields.items("state", TensorSpec.read, []),
            fields.strings("dropped_outputs", []),
            dict(constants),
            fields.boolean("state_in_place", False),
        )

    def to_json(self) -> dict:
        data: dict = {
            "inputs": [s.to_json(is_input=True) for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "dims": {name: dict(info) for name, info in self.dims.items()},
            "output_structure": self.output_structure,
        }
        if self.dropped_outputs:
            data["dropped_outputs"] = list(self.dropped_outputs)
        if self.constants:
            data["constants"] = dict(self.constants)
        if self.state:
            data["state"] = [s.to_json() for s in self.state]
        if self.state_in_place:
            data["state_in_place"] = True
        return data

    @property
    def input_names(self) -> tuple:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple:
        return tuple(s.name for s in self.outputs)

    def arrange(self, args: tuple, kwargs: dict) -> list:
        """Inputs given by position and/or by name -> the flat positional list the package takes."""
        if not kwargs:
            return list(args)
        names = self.input_names
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise InputMismatchError(
                f"the package has no input named {', '.join(map(repr, unknown))}; its inputs are {', '.join(names)}"
            )
        twice = [names[i] for i in range(min(len(args), len(names))) if names[i] in kwargs]
        if twice:
            raise InputMismatchError(
                f"input {twice[0]!r} is given both by position and by name; give it once"
            )
        flat = list(args) + [kwargs.get(name) for name in names[len(args) :]]
        missing = [name for name, value in zip(names, flat) if value is None]
        if missing:
            raise InputMismatchError(
                f"input(s) {', '.join(map(repr, missing))} missing; the package takes {', '.join(names)}"
            )
        return flat

    def check_inputs(self, tensors: Sequence[object]) -> None:
        """Raise InputMismatchError naming the input, what was expected and what was given."""
        if len(tensors) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise InputMismatchError(
                f"the package takes {len(self.inputs)} input(s) ({names}), {len(tensors)} given"
            )
        bound: dict[str, tuple[int, str]] = {}
        for index, (spec, tensor) in enumerate(zip(self.inputs, tensors)):
            self._check_one(index, spec, tensor, bound)

    def _check_one(self, index: int, spec: TensorSpec, tensor: object, bound: dict) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise InputMismatchError(
                f"input '{spec.name}' (#{index}) must be a tensor, got {type(tensor).__name__}"
            )
        dtype = DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype))
        self.check_declared(index, list(tensor.shape), dtype, bound)

    def check_declared(self, index: int, given: list, dtype: str, bound: dict) -> None:
        """The check check_inputs makes on input `index`, on a shape and dtype name an input file
        declares (an .npy header), before its data is read: the same messages. `bound` maps each
        dim name to (size, label) of the first input that set it; share it across the inputs."""
        spec = self.inputs[index]
        label = f"input '{spec.name}' (#{index})"
        expected = spec.describe(self.dims)
        if dtype != spec.dtype:
            raise InputMismatchError(
                f"{label} must be {spec.dtype}, got {dtype} (shape {given}); convert it or re-export "
                f"with --dtype {dtype}"
            )
        if len(given) != len(spec.shape):
            raise InputMismatchError(
                f"{label} must have {len(spec.shape)} dims {expected}, got {len(given)} dims {given}"
            )
        for axis, (want, have) in enumerate(zip(spec.shape, given)):
            if isinstance(want, int):
                if want != have:
                    raise InputMismatchError(
                        f"{label} must have shape {expected}, got {given}: dim {axis} is static {want}; "
                        "re-export with a named dim (--dim) to make it dynamic"
                    )
                continue
            low, high = self.dims[want]["min"], self.dims[want]["max"]
            if not low <= have <= high:
                raise InputMismatchError(
                    f"{label} must have shape {expected}, got {given}: dim {axis} ({want}) = {have} "
                    f"is outside {low}..{high}; "
                    f"re-export with a wider --dim {want}=MIN:MAX"
                )
            if want in bound and bound[want][0] != have:
                raise InputMismatchError(
                    f"{label} has {want} = {have} but {bound[want][1]} has {want} = {bound[want][0]}; "
                    "inputs sharing a dim name must agree"
                )
            bound.setdefault(want, (have, label))

    def dim_location(self, name: str) -> tuple:
        """(input index, axis) of the first input axis named `name`."""
        for index, spec in enumerate(self.inputs):
            if name in spec.shape:
                return index, spec.shape.index(name)
        raise KeyError(name)

    def specialized(self, sizes: dict) -> tuple:
        """The input specs with the dims in `sizes` fixed at those sizes (a --specialize member's)."""
        return tuple(
            dataclasses.replace(
                spec, shape=tuple(sizes.get(e, e) if isinstance(e, str) else e for e in spec.shape)
            )
            for spec in self.inputs
        )

    def specialization_difference(self, sizes: dict, inputs: tuple, ours: str) -> str | None:
        """How `inputs` (a --specialize member's) differ from this signature's at `sizes`, which
        the message calls `ours` ("the package's"): the first difference in count, name, dtype or
        shape, or None. The runtime's member check and the build's check of a cached specialized
        artifact ask the same question."""
        expected = self.specialized(sizes)
        if len(expected) != len(inputs):
            return f"it takes {len(inputs)} inputs where {ours} are {len(expected)}"
        for want, got in zip(expected, inputs):
            if (want.name, want.dtype, tuple(want.shape)) != (
                got.name,
                got.dtype,
                tuple(got.shape),
            ):
                return (
                    f"its input is {got.name} {got.dtype}{list(got.shape)} where {ours} is "
                    f"{want.name} {want.dtype}{list(want.shape)}"
                )
        return None

    def example_sizes(self) -> dict:
        return {name: info["example"] for name, info in self.dims.items()}

    def random_inputs(
        self, seed: int = 0, sizes: dict | None = None, device: str | torch.device = "cpu"
    ) -> list[torch.Tensor]:
        """Seeded random inputs that match the signature (dynamic dims at `sizes`, else their example)."""
        sizes = {**self.example_sizes(), **(sizes or {})}
        generator = torch.Generator().manual_seed(seed)
        tensors = []
        for spec in self.inputs:
            shape = [entry if isinstance(entry, int) else sizes[entry] for entry in spec.shape]
            tensors.append(random_tensor(shape, spec.dtype, spec.value_range, generator).to(device))
        return tensors


def random_tensor(
    shape: Sequence[int],
    dtype_name: str,
    value_range: Sequence[int] | None,
    generator: torch.Generator,
) -> torch.Tensor:
    dtype = DTYPES[dtype_name]
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    low, high = value_range if value_range else (0, 9)
    return torch.randint(int(low), int(high) + 1, shape, generator=generator, dtype=dtype)
