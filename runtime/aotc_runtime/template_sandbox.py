"""The Jinja environment a package's chat template renders in: transformers' own (its
`_compile_jinja_template` in transformers/utils/chat_template_utils.py: ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks, loopcontrols and the `{% generation %}` tag, its `tojson` filter,
`raise_exception` and `strftime_now`), so a template renders the prompt `apply_chat_template` renders,
with bounds on what a template may spend.

A chat template comes with a model folder, so it is untrusted. Jinja's sandbox already refuses
attribute escapes (`''.__class__.__mro__`), private attributes and calls that change data. What it
does not bound is memory and time, and one line of Jinja can ask for either (`'x' * 10**10`, a
string doubled in a loop, `range` nested in `range`). Here:

- every value a template makes (a sum, a repeat, a `~` join, a captured block, a call's or a
  filter's result) is held to MAX_TEXT characters, checked before the operations that multiply
  their input (repeats, powers, `replace`, `join`, `indent`, format widths) run;
- a number given to a call or filter (a width, a count) is held to MAX_ARGUMENT;
- `lipsum`, whose arguments loop inside one call, is not offered (no chat template uses it).

A template over a bound raises TemplateBoundError (a jinja2 SecurityError, as the sandbox's own
refusals are), which chat_template.py reports in one line. These checks name what a template asked
for; what they cannot see (a value built before it is measured, a loop inside a builtin) is held by
the process the template renders in: a capped address space and a deadline (template_worker.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from functools import wraps
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_TEXT = 4 << 20  # characters: any value a template makes, and the prompt it renders
MAX_ARGUMENT = 1 << 16  # a number a template gives a call or filter (a width, a count)
MAX_INDENT = 64  # tojson's indent
_FORMAT_NUMBER = re.compile(r"\d+")


class TemplateBoundError(SecurityError):
    """A chat template asked for more memory or time than a prompt needs."""


def _refuse(what: str) -> None:
    raise TemplateBoundError(what)


def _check_size(value: Any, what: str) -> Any:
    if isinstance(value, str | list | tuple | dict) and len(value) > MAX_TEXT:
        _refuse(f"{what} made {len(value):,} items, above the {MAX_TEXT:,} a template may make")
    return value


def _check_numbers(args: tuple, kwargs: dict, what: str) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_ARGUMENT:
            _refuse(
                f"{what} was given {value:,}, above the {MAX_ARGUMENT:,} a width or count may be"
            )


def _check_format(text: Any, what: str) -> None:
    """A printf or str.format string whose widths stay small (the width is allocated first)."""
    if isinstance(text, str) and any(
        int(n) > MAX_ARGUMENT for n in _FORMAT_NUMBER.findall(text) if len(n) > 4
    ):
        _refuse(f"{what} has a format width above {MAX_ARGUMENT:,}")


def _joined_size(separator: Any, items: list) -> int:
    return sum(len(str(i)) for i in items) + len(str(separator)) * max(len(items) - 1, 0)


def _replaced_size(text: Any, old: Any, new: Any) -> int:
    text, old, new = str(text), str(old), str(new)
    if not old:  # "" matches between every two characters
        return len(text) + (len(text) + 1) * len(new)
    return len(text) + text.count(old) * max(len(new) - len(old), 0)


def _check_projected(size: int, what: str) -> None:
    if size > MAX_TEXT:
        _refuse(
            f"{what} would make {size:,} characters, above the {MAX_TEXT:,} a template may make"
        )


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with `a ~ b` joined through the environment's bounded join (Jinja
    compiles it to a join of its own that no sandbox hook sees)."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Frame) -> None:
        self.write("environment.concat(map(str, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")


class _GenerationTag(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}`: marks the assistant's part for
    training masks; a prompt renders its body as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class BoundedSandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        )
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters["tojson"] = _bounded_filter("tojson", tojson)
        del self.globals["lipsum"]
        self.globals["raise_exception"] = raise_exception
        self.globals["strftime_now"] = strftime_now

    # `concat` joins every captured block, macro body and `~`: one place to hold them
    def concat(self, parts: Any) -> str:
        parts = list(parts)
        _check_projected(sum(len(p) for p in parts), "a joined string")
        return "".join(parts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int):
                    _check_projected(len(seq) * n, "a repeat (*)")
        elif operator == "**" and isinstance(left, int | float) and isinstance(right, int):
            # a float power overflows (OverflowError); an int one grows by its exponent's bits
            big = (
                isinstance(left, int) and abs(left) > 1 and right * abs(left).bit_length() > 1 << 16
            )
            if abs(right) > MAX_ARGUMENT or big:
                _refuse(f"a power ({left} ** {right}) is beyond what a template may compute")
        elif operator == "+" and isinstance(left, str | list | tuple) and hasattr(right, "__len__"):
            _check_projected(len(left) + len(right), "a sum (+)")
        elif operator == "%" and isinstance(left, str):
            _check_format(left, "a % format")
            _check_numbers(right if isinstance(right, tuple) else (right,), {}, "a % format")
        return _check_size(super().call_binop(context, operator, left, right), f"'{operator}'")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        name = getattr(__obj, "__name__", type(__obj).__name__)
        if __obj is not __self.globals.get("range"):  # the sandbox's range is held to 100,000
            _check_numbers(args, kwargs, f"{name}()")
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner = getattr(method, "__self__", None)
        if isinstance(owner, str):
            if name == "replace" and len(args) >= 2:
                _check_projected(_replaced_size(owner, args[0], args[1]), "replace()")
            elif name == "join" and args:
                args = (list(args[0]),) + args[1:]
                _check_projected(_joined_size(owner, args[0]), "join()")
            elif name == "expandtabs":
                tab = args[0] if args else kwargs.get("tabsize", 8)
                _check_projected(len(owner) + owner.count("\t") * int(tab), "expandtabs()")
            elif name in ("format", "format_map"):
                _check_format(owner, f"{name}()")
        result = super().call(__context, __obj, *args, **kwargs)
        return _check_size(result, f"{name}()")


def _bounded_filter(name: str, function: Callable) -> Callable:
    """A filter whose numbers, projected size and result are checked (see the module's text)."""
    takes_first = getattr(function, "jinja_pass_arg", None) is not None

    @wraps(function)  # keeps Jinja's pass_context/pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        own = args[1:] if takes_first else args  # the value, then the filter's arguments
        _check_numbers(own, kwargs, f"the {name} filter")
        value, rest = (own[0], own[1:]) if own else (None, ())
        if name == "replace" and len(rest) >= 2:
            _check_projected(_replaced_size(value, rest[0], rest[1]), "the replace filter")
        elif name == "join" and value is not None and not isinstance(value, str):
            value = list(value)
            args = (*args[: len(args) - len(own)], value, *rest)
            _check_projected(_joined_size(rest[0] if rest else "", value), "the join filter")
        elif name == "indent":
            width = rest[0] if rest else kwargs.get("width", 4)
            per_line = len(width) if isinstance(width, str) else int(width)
            lines = str(value).count("\n") + 1
            _check_projected(len(str(value)) + lines * per_line, "the indent filter")
        elif name == "format":
            _check_format(value, "the format filter")
        elif name == "tojson":
            indent = rest[0] if rest else kwargs.get("indent")
            if isinstance(indent, int) and indent > MAX_INDENT:
                _refuse(f"the tojson filter was given an indent of {indent}, above {MAX_INDENT}")
        return _check_size(function(*args, **kwargs), f"the {name} filter")

    return bounded


def raise_exception(message: Any) -> None:
    """What a template calls to refuse its messages (transformers' global of the same name)."""
    raise TemplateError(message)


def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
           sort_keys: bool = False) -> str:  # fmt: skip
    """transformers' tojson: json.dumps, no HTML escaping (Jinja's own escapes <, >, &, ')."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def strftime_now(format: str) -> str:  # noqa: A002  (transformers' name and argument)
    _check_format(format, "strftime_now()")
    return datetime.now().strftime(format)


def render_bounded(template: jinja2.Template, **variables: Any) -> str:
    """The template rendered, under MAX_TEXT characters (its time is held by its process)."""
    parts: list = []
    size = 0
    for chunk in template.generate(**variables):
        size += len(chunk)
        if size > MAX_TEXT:
            _refuse(f"the rendered prompt passed {MAX_TEXT:,} characters")
        parts.append(chunk)
    return "".join(parts)
