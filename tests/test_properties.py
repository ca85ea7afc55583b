"""Property-based tests (hypothesis): whatever text or JSON they are given, the shape/dim parser and
the manifest readers answer with a value or their own one-line error, never another exception.

Two families of inputs: arbitrary values, and mutations of valid ones (a real manifest built by the
`packages` fixture; shape and dim flags drawn from the forms aotc/export/shapes.py documents), since
random text almost never gets past the first check. Runs are derandomized and bounded (about 20 s
for the file, besides the package build it shares with other tests), so a failure reproduces.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aotc_runtime
from aotc.errors import UserInputError
from aotc.export.shapes import (
    DimSpec,
    InputShape,
    format_shape,
    parse_dim,
    parse_input_shape,
    parse_shape,
    resolve_dims,
)

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / ".venv" / "bin" / "aotc-runner"

PROPERTY = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def one_line(message: str) -> bool:
    return len(message.splitlines()) == 1


# ---------------------------------------------------------------- the shape and dim parser

MAX_SIZE = 2**31 - 1  # the largest size a manifest may declare (aotc_runtime/signature.py)

# Dim names as a shape can hold them: an 'x' would split the name ('max_len' reads as 'ma', '_len')
# and a shape that is only 'scalar' is the empty shape.
SHAPE_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True).filter(
    lambda name: "x" not in name and name.lower() != "scalar"
)
DIM_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True)
SIZES = st.integers(1, MAX_SIZE)
PADDING = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def shape_texts(draw) -> tuple[str, tuple]:
    """A well-formed shape, as text (spaced, signed and zero-padded variants) and as the tuple it means."""
    dims = draw(st.lists(st.one_of(SIZES, SHAPE_NAMES), min_size=1, max_size=6))
    tokens = []
    for dim in dims:
        token = (
            (draw(st.sampled_from(["", "+", "0", "+00"])) + str(dim))
            if isinstance(dim, int)
            else dim
        )
        tokens.append(draw(PADDING) + token + draw(PADDING))
    return "x".join(tokens), tuple(dims)


@st.composite
def dim_specs(draw, name=DIM_NAMES) -> DimSpec:
    low = draw(st.integers(1, MAX_SIZE - 1))
    high = draw(st.integers(max(low, 2), MAX_SIZE))
    example = draw(st.none() | st.integers(max(low, 2), high))
    targets = draw(
        st.lists(
            st.tuples(st.one_of(SHAPE_NAMES, st.integers(0, 99)), st.integers(0, 7)), max_size=3
        )
    )
    return DimSpec(draw(name), low, high, example, tuple(targets))


def dim_text(spec: DimSpec) -> str:
    text = f"{spec.name}={spec.min}:{spec.max}"
    if spec.example is not None:
        text += f":{spec.example}"
    if spec.targets:
        text += "@" + ",".join(f"{target}:{axis}" for target, axis in spec.targets)
    return text


# What a typo or a hostile flag puts into a shape: signs, zero, huge numbers, other digits
# (Arabic-Indic, fullwidth, superscript), line breaks and other whitespace, the separators.
ODD_PIECES = [
    "0", "-1", "-0", "+0", "00", "9" * 30, "9" * 5000, "1e3", "0x10", "1_000", "3.5", "NaN",
    "\u0663", "\uff11\uff16", "\u00b2", " ", "\t", "\n", "\r\n", "\u2028", "\x85", "\x0b", "\x00",
    "x", "X", "=", ":", "@", ",", "()", "scalar", "B", "_", "\u00e9", "\u221e",
]  # fmt: skip


@st.composite
def mutated_text(draw, valid: st.SearchStrategy[str]) -> str:
    """A valid text with 1-3 pieces inserted, deleted or replaced."""
    text = draw(valid)
    for _ in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, len(text)))
        piece = draw(st.sampled_from(ODD_PIECES) | st.text(max_size=3))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            text = text[:start] + piece + text[start:]
        elif op == "delete":
            text = text[:start] + text[end:]
        else:
            text = text[:start] + piece + text[end:]
    return text


SHAPE_TEXT = shape_texts().map(lambda pair: pair[0])
INPUT_SHAPE_TEXT = st.builds(lambda name, shape: f"{name}={shape}", DIM_NAMES, SHAPE_TEXT)
DIM_TEXT = dim_specs().map(dim_text)
ANY_TEXT = st.text() | st.lists(st.sampled_from(ODD_PIECES) | st.text(max_size=2), max_size=8).map(
    "".join
)


def parses_or_refuses(parse, text: str) -> None:
    """`parse(text)` returns, or raises a ValueError of one line of its own.

    ValueError, not UserInputError, is the parsers' contract: the CLI's ParsedType (aotc/cli/types.py)
    turns it into a usage error, exit 2, as it does for every flag type.
    """
    try:
        parse(text)
    except ValueError as exc:
        message = str(exc)
        assert one_line(message), message
        # Every message of the parser names what it refuses; anything else is Python's own ValueError
        # escaping (int() of 5000 digits), which tells the user nothing about the flag.
        assert message.startswith(("empty shape", "shape ", "input shape ", "dim ")), message


@PROPERTY
@given(shape_texts())
def test_well_formed_shapes_round_trip(case):
    text, dims = case
    assert parse_shape(text) == dims
    assert parse_shape(format_shape(dims)) == dims
    assert parse_input_shape(text) == InputShape(None, dims)


@PROPERTY
@given(DIM_NAMES, shape_texts())
def test_named_input_shapes_round_trip(name, case):
    text, dims = case
    parsed = parse_input_shape(f" {name} ={text}")
    assert parsed == InputShape(name, dims)
    assert parse_input_shape(str(parsed)) == parsed


def test_the_empty_shape_round_trips():
    for text in ("scalar", "SCALAR", " () "):
        assert parse_shape(text) == ()
    assert parse_shape(format_shape(())) == ()


@PROPERTY
@given(dim_specs())
def test_well_formed_dims_round_trip(spec):
    assert parse_dim(dim_text(spec)) == spec
    # The flag a problem report prints is one the parser reads back (it leaves out the example).
    assert parse_dim(spec.flag().removeprefix("--dim ")) == dataclasses.replace(spec, example=None)
    size = spec.example_size()
    assert spec.min <= size <= spec.max and size >= 2


@PROPERTY
@given(ANY_TEXT | mutated_text(SHAPE_TEXT))
def test_any_text_parses_as_a_shape_or_is_refused(text):
    parses_or_refuses(parse_shape, text)


@PROPERTY
@given(ANY_TEXT | mutated_text(INPUT_SHAPE_TEXT))
def test_any_text_parses_as_an_input_shape_or_is_refused(text):
    parses_or_refuses(parse_input_shape, text)


@PROPERTY
@given(ANY_TEXT | mutated_text(DIM_TEXT))
def test_any_text_parses_as_a_dim_or_is_refused(text):
    parses_or_refuses(parse_dim, text)


@PROPERTY
@given(st.data())
def test_resolve_dims_gives_every_named_dim_a_range_holding_its_example(data):
    shapes = data.draw(
        st.lists(st.lists(st.one_of(SIZES, SHAPE_NAMES), max_size=4).map(tuple), max_size=4)
    )
    used = sorted({entry for shape in shapes for entry in shape if isinstance(entry, str)})
    dims = [parse_dim(dim_text(data.draw(dim_specs(st.just(name))))) for name in used]
    resolved = resolve_dims(shapes, dims)
    assert sorted(resolved) == used
    for name, spec in resolved.items():
        size = spec.example_size()
        assert spec.name == name and spec.min <= size <= spec.max and size >= 2
        assert spec.to_dict() == {"min": spec.min, "max": spec.max, "example": size}


@PROPERTY
@given(st.data())
def test_resolve_dims_refuses_missing_unused_and_repeated_dims(data):
    shapes = data.draw(
        st.lists(st.lists(st.one_of(SIZES, SHAPE_NAMES), max_size=4).map(tuple), max_size=4)
    )
    used = sorted({entry for shape in shapes for entry in shape if isinstance(entry, str)})
    dims = [data.draw(dim_specs(st.just(name))) for name in used]
    broken = data.draw(st.sampled_from(["missing", "unused", "twice"]))
    if broken == "missing":
        if not dims:
            return
        culprit = dims.pop(data.draw(st.integers(0, len(dims) - 1))).name
    elif broken == "unused":
        culprit = data.draw(SHAPE_NAMES.filter(lambda name: name not in used))
        dims.append(data.draw(dim_specs(st.just(culprit))))
    else:
        if not dims:
            return
        culprit = data.draw(st.sampled_from(dims)).name
        dims.append(data.draw(dim_specs(st.just(culprit))))
    with pytest.raises(UserInputError) as refused:
        resolve_dims(shapes, data.draw(st.permutations(dims)))
    message = str(refused.value)
    assert one_line(message) and culprit in message, message


# What the properties above found: a line break (or another line separator) in a flag was printed
# raw into the one-line error, and a number of 5000 digits escaped as int()'s own ValueError.
@pytest.mark.parametrize(
    "parse, text",
    [
        (parse_shape, "0\r0"),
        (parse_shape, "16x3\nx"),
        (parse_shape, "16x\u2028x3"),
        (parse_input_shape, "0\x1e0"),
        (parse_input_shape, "in\nput=8x128"),
        (parse_dim, "\x1e"),
        (parse_dim, "B=1:64@x\ny:0"),
        (parse_shape, "9" * 5000),
        (parse_shape, "16x-" + "9" * 5000),
        (parse_dim, "B=1:" + "9" * 5000),
    ],
)
def test_found_refusals_are_one_line_and_the_parsers_own(parse, text):
    with pytest.raises(ValueError) as refused:
        parse(text)
    message = str(refused.value)
    assert one_line(message) and message.startswith(("shape ", "input shape ", "dim ")), message


def test_sizes_above_what_a_package_may_declare_are_refused():
    assert parse_shape(f"{MAX_SIZE}x1") == (MAX_SIZE, 1)
    assert parse_dim(f"B=1:{MAX_SIZE}").max == MAX_SIZE
    for parse, text in [(parse_shape, f"{MAX_SIZE + 1}x1"), (parse_dim, f"B=1:{MAX_SIZE + 1}")]:
        with pytest.raises(ValueError, match=f"sizes must be between 1 and {MAX_SIZE}"):
            parse(text)


# ---------------------------------------------------------------- the manifest reader (Python)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
NESTED = (
    200  # a list this deep: enough to hurt what recurses; within reach of json, repr and deepcopy
)
DEEP_TEXT = "\x00deep\x00"  # in written manifests: replaced by a list nested 200,000 deep


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


# Values a damaged or hostile manifest may hold where a valid one has something else.
SPECIAL_VALUES = [
    None, True, False, 0, -1, 1, 2, 3, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64,
    -(2**63), -(2**63) - 1, 10**30, -(10**30), 10**4000,
    0.0, -0.0, 1.5, 1e308, 5e-324, math.nan, math.inf, -math.inf,
    "", " ", "\n", "a\nb", "\u2028", "x" * 100_000, "\u00e9" * 50_000, "\x00",
    "complex32", "float33", "cuda", "pending", "../x", "/etc/passwd", "model.pt2", "B", "2*B",
    [], {}, [None], [1, 2], ["B"], [-1], [2**31, 2**31], {"status": "pending"},
    {"min": 1, "max": 8, "example": 4}, {"min": 8, "max": 1, "example": 4},
    nested(NESTED), DEEP_TEXT,
]  # fmt: skip
# Keys a mutation may add to an object: ones a reader looks for, and nonsense.
KEYS = st.sampled_from(
    ["dims", "state", "keyword", "value_range", "cuda", "example", "source", "runtime", "constants",
     "dropped_outputs", "output_structure", "status", "../model.pt2", "a\nb", ""]
) | st.text(max_size=8)  # fmt: skip
REPLACEMENTS = st.sampled_from(SPECIAL_VALUES) | JSON_VALUES


def paths_in(document: object, max_depth: int = 10) -> list[tuple]:
    """Every path (keys and indexes) into a JSON document but the root (); iterative."""
    found, stack = [], [((), document)]
    while stack:
        path, value = stack.pop()
        if path:
            found.append(path)
        if len(path) >= max_depth:
            continue
        if isinstance(value, dict):
            stack += [((*path, key), child) for key, child in value.items()]
        elif isinstance(value, list):
            stack += [((*path, index), child) for index, child in enumerate(value)]
    # The signature first: hypothesis draws the first choices most, and it is the part most checked.
    return sorted(found, key=lambda p: (p[0] != "signature", len(p), [str(k) for k in p]))


def at(document: Any, path: tuple) -> Any:
    for key in path:
        document = document[key]
    return document


@st.composite
def mutated_manifests(draw, bases: list, replacements=REPLACEMENTS) -> object:
    """A valid manifest with 1-3 mutations: a key deleted, a value replaced (by a special value, a
    random JSON value or another part of the manifest), a key added, a list item repeated. (A
    document that is not an object at all: test_any_json_is_a_manifest_or_a_field_error.)"""
    document = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 3))):
        paths = paths_in(document)
        if not paths:  # everything deleted
            break
        # A top-level section, then a place in it: every section gets drawn, not only the big ones.
        section = draw(
            st.sampled_from(sorted({p[0] for p in paths}, key=lambda k: (k != "signature", str(k))))
        )
        path = draw(st.sampled_from([p for p in paths if p[0] == section]))
        target = at(document, path)
        op = draw(st.sampled_from(["delete", "replace", "replace", "swap", "add", "repeat"]))
        if op == "delete":
            del at(document, path[:-1])[path[-1]]
        elif op == "swap":
            at(document, path[:-1])[path[-1]] = copy.deepcopy(
                at(document, draw(st.sampled_from(paths)))
            )
        elif op == "add" and isinstance(target, dict):
            target[draw(KEYS)] = copy.deepcopy(draw(replacements))
        elif op == "repeat" and isinstance(target, list) and target:
            target.append(copy.deepcopy(draw(st.sampled_from(target))))
        else:
            at(document, path[:-1])[path[-1]] = copy.deepcopy(draw(replacements))
    return document


def manifest_text(document: object) -> str:
    """The document as manifest.json's text; DEEP_TEXT becomes a list nested 200,000 deep."""
    deep = "[" * 200_000 + "]" * 200_000
    return json.dumps(document, indent=1).replace(json.dumps(DEEP_TEXT), deep)


def same(a: object, b: object) -> bool:
    """a == b, but NaN equals NaN (a manifest may hold NaN where a number goes)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.fixture(scope="module")
def mlp_package(packages) -> Path:
    return packages.get("mlp").package


@pytest.fixture(scope="module")
def real_manifest(mlp_package) -> dict:
    return json.loads((mlp_package / "manifest.json").read_text())


class Documents(list):
    """The base manifests, also by name; a repr that stays short in hypothesis's reports."""

    def __init__(self, **named: dict):
        super().__init__(named.values())
        self.__dict__.update(named)

    def __repr__(self) -> str:
        return f"<{len(self)} manifests>"


@pytest.fixture(scope="module")
def bases(real_manifest) -> list:
    """Valid manifests to mutate: the real one as built, as format 2 (no manifest hash, so an edit
    reaches the field checks), as format 1, and one using every optional part of the signature."""
    real = copy.deepcopy(real_manifest)
    format_2 = {k: v for k, v in copy.deepcopy(real).items() if k != "manifest_sha256"}
    format_2["format_version"] = 2
    format_1 = copy.deepcopy(format_2)
    format_1["format_version"] = 1
    del format_1["runtime"]
    del format_1["signature"]["output_structure"]
    rich = copy.deepcopy(format_2)
    signature = rich["signature"]
    signature["inputs"][0]["shape"] = ["B", 128]
    signature["inputs"].append(
        {
            "name": "ids",
            "dtype": "int64",
            "shape": ["B", 7],
            "value_range": [0, 99],
            "keyword": True,
        }
    )
    signature["outputs"][0]["shape"] = ["B", 10]
    signature["dims"] = {"B": {"min": 1, "max": 64, "example": 16}}
    signature["output_structure"] = "dict"
    signature["state"] = [{"name": "count", "dtype": "float32", "shape": [1]}]
    signature["dropped_outputs"] = ["past_key_values"]
    signature["constants"] = {"return_dict": True}
    pending = copy.deepcopy(format_2)
    pending["numeric_check"] = {"status": "pending"}
    documents = Documents(
        real=real, format_2=format_2, format_1=format_1, rich=rich, pending=pending
    )
    for document in documents:
        aotc_runtime.Manifest.from_json(document)  # each base is valid
    return documents


def from_json_or_refuse(document: object):
    """Manifest.from_json(document), or None after checking its refusal is a one-line FieldError."""
    try:
        return aotc_runtime.Manifest.from_json(document)
    except aotc_runtime.FieldError as exc:
        assert isinstance(exc.field, str) and one_line(str(exc)), str(exc)
        return None


def test_valid_manifests_round_trip(bases):
    for document in bases:
        manifest = aotc_runtime.Manifest.from_json(document)
        assert aotc_runtime.Manifest.from_json(manifest.to_json()) == manifest


@PROPERTY
@given(JSON_VALUES)
def test_any_json_is_a_manifest_or_a_field_error(document):
    from_json_or_refuse(document)


@PROPERTY
@given(st.data())
def test_mutated_manifests_are_read_or_refused_with_a_field_error(bases, data):
    replacements = REPLACEMENTS | st.just(10**5000)  # an int that repr() and json refuse to write
    document = data.draw(mutated_manifests(bases, replacements))
    manifest = from_json_or_refuse(document)
    if manifest is None:
        return
    # What the reader accepts, the writer writes back as a manifest the reader accepts, unchanged.
    written = manifest.to_json()
    again = aotc_runtime.Manifest.from_json(written)
    assert again == manifest and same(again.to_json(), written)


@pytest.fixture(scope="module")
def manifest_folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("manifest_only")


def read_or_refuse(folder: Path):
    """read_manifest(folder), or None after checking its refusal is a PackageError."""
    try:
        return aotc_runtime.read_manifest(folder)
    except aotc_runtime.PackageError as exc:
        message = str(exc)
        # "has package format X": X is printed raw, a line break in it breaks the line; see
        # test_a_format_version_with_a_line_break_is_refused_on_one_line.
        assert one_line(message) or "has package format" in message, message
        return None


@PROPERTY
@given(st.data())
def test_read_manifest_reads_or_refuses_with_a_package_error(bases, manifest_folder, data):
    document = data.draw(mutated_manifests(bases))
    (manifest_folder / "manifest.json").write_text(manifest_text(document))
    read_or_refuse(manifest_folder)


@PROPERTY
@given(st.data())
def test_read_manifest_survives_damaged_bytes(bases, manifest_folder, data):
    """Bytes inserted, deleted or overwritten anywhere in the file (invalid UTF-8 included)."""
    raw = bytearray(json.dumps(data.draw(st.sampled_from(bases)), indent=1).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        start = data.draw(st.integers(0, len(raw)))
        end = data.draw(st.integers(start, min(len(raw), start + 40)))
        piece = data.draw(
            st.binary(max_size=6)
            | st.sampled_from([b"\xff", b"\xc3", b"[" * 5000, b"9" * 400, b"NaN"])
        )
        raw[start:end] = piece
    (manifest_folder / "manifest.json").write_bytes(bytes(raw))
    read_or_refuse(manifest_folder)


def edited(document: dict, place: str, value: object) -> dict:
    """A copy of the document with the value at `place` ("signature.inputs.1.dtype") set."""
    document = copy.deepcopy(document)
    *parents, last = [int(key) if key.isdigit() else key for key in place.split(".")]
    at(document, tuple(parents))[last] = value
    return document


# Found by the properties above, or while writing them: each was a ValueError (not a FieldError) or
# a message of two lines, or (value_range) a manifest accepted that `aotc run` then failed on.
FOUND_IN_MANIFESTS = [
    # repr() of an int of 5000 digits raised ValueError; repr() of a deep list recursed once per level
    pytest.param("mode", 10**5000, "mode is ", id="int-of-5000-digits"),
    pytest.param("mode", nested(5000), "mode is [[[[...]]]]", id="nested-5000-deep"),
    # a dim name holding a line break, printed raw
    pytest.param(
        "signature.dims",
        {"a\nb": {"min": 2, "max": 1, "example": 1}},
        "signature.dims.'a\\nb' range",
        id="line-break-in-a-dim",
    ),
    pytest.param(
        "signature.inputs.0.shape",
        ["a\u2028b", 128],
        "no range in signature.dims: 'a\\u2028b'",
        id="line-separator-in-a-dim-name",
    ),
    # the element count of 500 sizes of 2**31-1: 4700 digits, too long for str()
    pytest.param("signature.inputs.0.shape", [MAX_SIZE] * 500, "elements or more", id="long-shape"),
    # accepted, then `aotc run` failed in randint: an inverted range, and high + 1 past int64
    pytest.param(
        "signature.inputs.1.value_range", [5, 2], "value_range is [5, 2]", id="inverted-range"
    ),
    pytest.param(
        "signature.inputs.1.value_range", [0, 2**63 - 1], "value_range is", id="range-past-int64"
    ),
]


@pytest.mark.parametrize("place, value, fragment", FOUND_IN_MANIFESTS)
def test_found_manifest_refusals_are_one_line_field_errors(bases, place, value, fragment):
    with pytest.raises(aotc_runtime.FieldError) as refused:
        aotc_runtime.Manifest.from_json(edited(bases.rich, place, value))
    message = str(refused.value)
    assert one_line(message) and fragment in message, message


def test_a_value_range_must_fit_its_dtype(bases):
    for dtype, value_range, ok in [
        ("int64", [-(2**63), 2**63 - 2], True),
        ("uint8", [0, 255], True),
        ("uint8", [0, 256], False),
        ("int8", [-129, 0], False),
        ("float32", [5, 2], True),  # not drawn from: random float inputs ignore it
    ]:
        document = edited(bases.rich, "signature.inputs.1.dtype", dtype)
        document["signature"]["inputs"][1]["value_range"] = value_range
        if ok:
            aotc_runtime.Manifest.from_json(document)
        else:
            with pytest.raises(aotc_runtime.FieldError, match="value_range"):
                aotc_runtime.Manifest.from_json(document)


# Found by the properties above, fixed in runtime/aotc_runtime/manifest.py.
def test_an_integer_of_5000_digits_is_a_package_error(real_manifest, tmp_path):
    text = json.dumps(real_manifest).replace(
        '"build_seconds": ', '"build_seconds": ' + "9" * 5000 + ', "_": ', 1
    )
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(aotc_runtime.PackageError):
        aotc_runtime.read_manifest(tmp_path)


def test_a_format_version_with_a_line_break_is_refused_on_one_line(real_manifest, tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({**real_manifest, "format_version": "2\n3"}))
    with pytest.raises(aotc_runtime.PackageError) as refused:
        aotc_runtime.read_manifest(tmp_path)
    assert one_line(str(refused.value)), str(refused.value)


def test_a_contract_difference_under_a_key_with_a_line_break_is_one_line(
    bases, mlp_package, tmp_path
):
    folder = tmp_path / "pkg"
    shutil.copytree(mlp_package, folder)
    dims = {"a\nb": {"min": 1, "max": 2, "example": 1}}  # valid, and named by no input
    (folder / "manifest.json").write_text(
        json.dumps(edited(bases.format_2, "signature.dims", dims))
    )
    with pytest.raises(aotc_runtime.PackageError) as refused:
        aotc_runtime.load(folder)
    assert one_line(str(refused.value)), str(refused.value)


# ---------------------------------------------------------------- the C++ runner's manifest reader


@pytest.fixture(scope="module")
def runner_package(mlp_package, bases, tmp_path_factory) -> tuple[Path, Path]:
    """A copy of the mlp package (its manifest rewritten by each example) and an input file for it."""
    if not RUNNER.is_file():
        pytest.skip(f"the C++ runner is not built ({RUNNER}); build it with `make runner`")
    folder = tmp_path_factory.mktemp("runner") / "pkg"
    shutil.copytree(mlp_package, folder)
    inputs = folder.parent / "x.npy"
    numpy.save(inputs, numpy.zeros((32, 128), numpy.float32))
    return folder, inputs


@settings(PROPERTY, max_examples=40)
@given(st.data())
def test_cpp_runner_refuses_mutated_manifests_on_one_line(runner_package, bases, data):
    """Exit 7 for a refused manifest, 0 for a harmless edit, never a crash.

    An edit the reader cannot see as wrong (a dtype or a size the model does not have) gets as far
    as the call: exit 8 if the input file no longer matches, 1 if the model fails. The input file is
    given so that no edit makes the runner allocate random inputs of 2**32 elements.
    """
    folder, inputs = runner_package
    # Format 2: the C++ runner reads formats 1 and 2, and such a manifest has no hash to refuse edits by.
    document = data.draw(mutated_manifests([base for base in bases if base["format_version"] <= 2]))
    (folder / "manifest.json").write_text(manifest_text(document))
    returncode, stderr = run_runner(folder, inputs)
    assert returncode in (0, 1, 7, 8), (returncode, stderr[-2000:])
    if returncode != 0:
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), stderr[:2000]


def run_runner(folder: Path, inputs: Path) -> tuple[int, str]:
    result = subprocess.run(
        [str(RUNNER), str(folder), "--input", str(inputs)], capture_output=True, timeout=120
    )
    return result.returncode, result.stderr.decode(errors="replace")


# Found while writing the property above (DEEP_TEXT is among its values, but 40 examples rarely put
# it where the reader prints it): the C++ reader printed a refused value with json::dump(), which
# recurses once per nesting level, so a list nested 100,000 deep was a SIGSEGV. And the cases the
# Python reader got wrong, which the C++ one got wrong alike: a line break printed raw, a
# value_range that randint then failed on (high + 1 past int64: a signed overflow).
@pytest.mark.parametrize(
    "base, place, value, fragment",
    [
        *[
            ("format_2", place, DEEP_TEXT, "nested more than")
            for place in (
                "format_version",
                "mode",
                "precision",
                "device.type",
                "signature.inputs.0.dtype",
            )
        ],
        (
            "format_2",
            "signature.constants",
            DEEP_TEXT,
            "nested more than",
        ),  # dumped for the contract
        (
            "rich",
            "signature.dims",
            {"a\nb": {"min": 2, "max": 1, "example": 1}},
            'dims."a\\nb" range',
        ),
        ("rich", "signature.inputs.0.shape", ["a\u2028b", 128], '"a\\u2028b"'),
        ("rich", "files", {"model.pt2": "0" * 64, "a\n/../b": "0" * 64}, 'names "a\\n/../b"'),
        ("rich", "mode", "a\nb", 'mode is "a\\nb"'),
        ("rich", "signature.inputs.1.value_range", [5, 2], "value_range is [5, 2]"),
        ("rich", "signature.inputs.1.value_range", [0, 2**63 - 1], "value_range is"),
        ("rich", "signature.inputs.1.value_range", [2**64 - 1, 2**64 - 1], "value_range is not"),
        # valid, named by no input: refused as differing from the model's description, by its path
        (
            "format_2",
            "signature.dims",
            {"a\nb": {"min": 1, "max": 2, "example": 1}},
            'signature.dims."a\\nb" is',
        ),
    ],
)
def test_cpp_runner_refuses_found_cases_on_one_line(
    runner_package, bases, base, place, value, fragment
):
    folder, inputs = runner_package
    (folder / "manifest.json").write_text(manifest_text(edited(getattr(bases, base), place, value)))
    returncode, stderr = run_runner(folder, inputs)
    assert returncode == 7, (returncode, stderr[-2000:])
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], stderr[
        :2000
    ]
