"""Typed reading of a JSON object, field by field, with errors that name the field.

A manifest is read by runtimes that trust nothing in it: every field is checked for its type
before use, and the first wrong one is reported by its path (`signature.inputs[0].dtype`), not
as a KeyError deep inside a call.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")
_MISSING = object()

# repr() of a manifest's value for a message, bounded: repr() recurses once per nesting level (a
# list nested 5000 deep raised RecursionError), refuses ints of more than 4300 digits (ValueError),
# and would copy a 16 MiB string into the one-line error.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40


def shown(value: Any) -> str:
    try:
        return _REPR.repr(value)
    except ValueError:  # an int too long for repr() (reprlib calls it before truncating)
        return "(a value too long to show)"


class FieldError(ValueError):
    """A field is missing or has the wrong type; `field` is its dotted path."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field} {problem}")
        self.field = field


class Fields:
    """One JSON object being read; `where` is its path from the document's root ('' at the root)."""

    def __init__(self, data: Any, where: str = ""):
        if not isinstance(data, dict):
            raise FieldError(where or "(document)", "is not an object")
        self.data: dict = data
        self.where = where

    def path(self, key: str) -> str:
        # A key is any JSON string: quoted when it holds a line break or other control character,
        # which would split the one-line error.
        key = key if str(key).isprintable() else repr(key)
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str, problem: str) -> NoReturn:
        raise FieldError(self.path(key), problem)

    def value(self, key: str, default: Any = _MISSING) -> Any:
        """The raw value of `key` (any JSON type); missing and no default: FieldError."""
        value = self.data.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                self.fail(key, "is missing")
            return default
        return value

    def text(self, key: str, default: Any = _MISSING) -> Any:
        value = self.value(key, default)
        if value is not default and not isinstance(value, str):
            self.fail(key, "is not a string")
        return value

    def optional_text(self, key: str) -> str | None:
        value = self.value(key, None)
        if value is not None and not isinstance(value, str):
            self.fail(key, "is not a string or null")
        return value

    def choice(self, key: str, options: tuple, default: Any = _MISSING) -> Any:
        value = self.value(key, default)
        if value is not default and value not in options:
            self.fail(key, f"is {shown(value)}, not one of {', '.join(map(str, options))}")
        return value

    def integer(self, key: str, default: Any = _MISSING) -> Any:
        value = self.value(key, default)
        if value is not default and (not isinstance(value, int) or isinstance(value, bool)):
            self.fail(key, "is not an integer")
        return value

    def number(self, key: str, default: Any = _MISSING) -> Any:
        value = self.value(key, default)
        if value is not default and (
            not isinstance(value, (int, float)) or isinstance(value, bool)
        ):
            self.fail(key, "is not a number")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        value = self.value(key, default)
        if value is not default and not isinstance(value, bool):
            self.fail(key, "is not true or false")
        return value

    def object(self, key: str, default: Any = _MISSING) -> Fields:
        return Fields(self.value(key, default), self.path(key))

    def raw_object(self, key: str, default: Any = _MISSING) -> dict:
        """An object kept as JSON (free-form fields such as Inductor options)."""
        return self.object(key, default).data

    def items(
        self, key: str, read: Callable[[Fields], T], default: Any = _MISSING
    ) -> tuple[T, ...]:
        """A list of objects, each read by `read`."""
        value = self.value(key, default)
        if not isinstance(value, list):
            self.fail(key, "is not a list")
        return tuple(
            read(Fields(item, f"{self.path(key)}[{index}]")) for index, item in enumerate(value)
        )

    def strings(self, key: str, default: Any = _MISSING) -> tuple[str, ...]:
        value = self.value(key, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, "is not a list of strings")
        return tuple(value)

    def mapping(
        self, key: str, read: Callable[[Fields, str], T], default: Any = _MISSING
    ) -> dict[str, T]:
        """An object of name -> value, each value read by `read(fields_of_parent, name)`."""
        inner = self.object(key, default)
        return {name: read(inner, name) for name in inner.data}


def inside_package(rel: str) -> bool:
    """A relative POSIX path that stays in the package: no absolute path, no `..`, no empty part."""
    parts = rel.split("/")
    return (
        bool(rel)
        and not rel.startswith("/")
        and "\\" not in rel
        and all(p not in ("", ".", "..") for p in parts)
    )
