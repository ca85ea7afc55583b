import pytest

from aotc.errors import UserInputError
from aotc.export.shapes import DimSpec, parse_dim, parse_shape, resolve_dims


def test_static_and_named_dims():
    assert parse_shape("16x3x128x128") == (16, 3, 128, 128)
    assert parse_shape("Bx128") == ("B", 128)


@pytest.mark.parametrize(
    "text, message",
    [
        ("16x3xx128", "empty dim at position 3"),
        ("16x-3", "dim 2 is -3; sizes must be >= 1"),
        ("0x3", "dim 1 is 0; sizes must be >= 1"),
        ("16x3.5", "neither a positive integer nor a dim name"),
        ("", "empty shape"),
    ],
)
def test_malformed_shapes(text, message):
    with pytest.raises(ValueError, match=message):
        parse_shape(text)


def test_dim_ranges_and_default_example():
    assert parse_dim("B=1:64") == DimSpec("B", 1, 64, None)
    assert parse_dim("B=1:64").example_size() == 16
    assert parse_dim("B=1:8").example_size() == 8
    assert parse_dim("B=1:64:32").example_size() == 32
    for bad, message in [
        ("B=1", "NAME=MIN:MAX"),
        ("B=8:4", "below MIN"),
        ("B=1:64:100", "outside its range"),
        ("B=0:4", ">= 1"),
        ("B=1:1", "can only be 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_dim(bad)


def test_resolve_dims_reports_missing_and_unused():
    with pytest.raises(UserInputError, match="has no range: pass --dim abc=MIN:MAX"):
        resolve_dims([("abc",)], [])
    with pytest.raises(UserInputError, match="--dim C names no dim"):
        resolve_dims([("B", 4)], [DimSpec("B", 1, 8), DimSpec("C", 1, 8)])
    assert set(resolve_dims([("B", 4), ("B",)], [DimSpec("B", 1, 8)])) == {"B"}
