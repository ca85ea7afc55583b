"""A package's chat template: a conversation (a list of {role, content} messages) rendered into the
prompt the model was trained on, as transformers' `apply_chat_template` renders and tokenizes it.

The template is the package's `chat_template.jinja` (manifest `generation.chat_template`, hashed
with every other file), rendered with the package's special tokens (`generation.special_tokens`:
bos_token, eos_token, ...) as transformers passes its tokenizer's. It came with a model folder, so
it is untrusted: it renders in template_sandbox.py's bounded sandbox, and what it refuses or
oversteps is one line.

    template = ChatTemplate.of_package(package)       # None: the package carries no template
    ids = template.prompt_ids(package.tokenizer, [{"role": "user", "content": "Hi"}])
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import GenerationInputError, MissingDependencyError, PackageError

MAX_TEMPLATE_BYTES = 1 << 20  # real chat templates are a few KiB; the largest, with tools, ~40 KiB
MAX_MESSAGES = 10_000
MAX_MESSAGE_CHARS = 1 << 20  # the characters of all messages together
_FIX = "export the model from a folder whose chat template you trust (aotc export MODEL_DIR --task text-generation)"


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(
        self,
        text: str,
        special_tokens: Mapping[str, str] | None = None,
        origin: str = "the chat template",
    ):
        self.text = text
        self.special_tokens = {
            k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)
        }
        self.origin = origin  # names the template in messages: "package lm_pkg: its chat template"
        try:
            import jinja2
        except ImportError:
            raise MissingDependencyError("chat templates need jinja2; pip install jinja2") from None
        from .template_sandbox import BoundedSandbox

        try:
            self._template = BoundedSandbox().from_string(text)
        except jinja2.TemplateSyntaxError as exc:
            raise PackageError(
                f"{origin} is not a Jinja template (line {exc.lineno}: {exc.message}); {_FIX}"
            ) from None

    @classmethod
    def of_package(cls, package: Any) -> ChatTemplate | None:
        """The chat template a text-generation package carries, or None; PackageError for a
        template file that is missing, too large, or not the one the manifest hashed."""
        generation = package.generation
        relative = getattr(generation, "chat_template", None)
        if relative is None:
            return None
        origin = f"package {package.path}: its chat template {relative}"
        text = _read_hashed(Path(package.path), relative, package.manifest.files, origin)
        return cls(text, getattr(generation, "special_tokens", None) or {}, origin)

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The conversation as the prompt's text (apply_chat_template(tokenize=False))."""
        check_messages(messages)
        import jinja2

        from .template_sandbox import render_bounded

        variables = {
            **self.special_tokens,
            "messages": [dict(m) for m in messages],
            "tools": None,
            "documents": None,
            "add_generation_prompt": bool(add_generation_prompt),
        }
        try:
            return render_bounded(self._template, **variables)
        except jinja2.exceptions.SecurityError as exc:  # an escape, or a bound overstepped
            raise PackageError(f"{self.origin} was stopped: {_first_line(exc)}; {_FIX}") from None
        except jinja2.TemplateError as exc:  # raise_exception(...), or an undefined it needed
            raise GenerationInputError(
                f"{self.origin} refuses these messages: {_first_line(exc)}"
            ) from None
        except (RecursionError, MemoryError) as exc:
            raise PackageError(f"{self.origin} was stopped: {type(exc).__name__}; {_FIX}") from None
        except Exception as exc:  # the template's own arithmetic or indexing on these messages
            raise GenerationInputError(
                f"{self.origin} failed on these messages ({type(exc).__name__}: {_first_line(exc)})"
            ) from None

    def prompt_ids(
        self,
        tokenizer: Any,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The prompt's token ids, as apply_chat_template(tokenize=True) makes them: the rendered
        text encoded without the tokenizer's own special tokens (the template wrote them)."""
        text = self.render(messages, add_generation_prompt)
        return list(tokenizer.encode(text, add_special_tokens=False).ids)


def check_messages(messages: Any) -> None:
    """A list of {"role": str, "content": str} dicts, within the bounds above; one line if not."""
    shape = 'give a list of {"role": ..., "content": "text"} messages'
    if not isinstance(messages, list | tuple) or not messages:
        raise GenerationInputError(f"the messages are {_kind(messages)}; {shape}")
    if len(messages) > MAX_MESSAGES:
        raise GenerationInputError(
            f"{len(messages):,} messages, above the {MAX_MESSAGES:,} a chat may hold"
        )
    total = 0
    for number, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise GenerationInputError(f"message {number} is {_kind(message)}; {shape}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise GenerationInputError(
                    f"message {number} has no text {key!r} (it is {_kind(message.get(key))}); {shape}"
                )
        total += len(message["content"])
    if total > MAX_MESSAGE_CHARS:
        raise GenerationInputError(
            f"the messages hold {total:,} characters, above the {MAX_MESSAGE_CHARS:,} a chat may hold"
        )


def _read_hashed(folder: Path, relative: str, files: Mapping[str, str], origin: str) -> str:
    """The file's text, read once, bounded, and checked against the manifest's hash (the file is
    read after load() verified it: what is rendered is what was hashed and signed)."""
    expected = files.get(relative)
    if expected is None:
        raise PackageError(
            f"{origin} is not one of the package's hashed files; rebuild it with `aotc build --force`"
        )
    try:
        with open(folder / relative, "rb") as handle:
            data = handle.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise PackageError(
            f"{origin} could not be read ({exc.strerror}); rebuild it with `aotc build --force`"
        ) from None
    if len(data) > MAX_TEMPLATE_BYTES:
        raise PackageError(
            f"{origin} is above the {MAX_TEMPLATE_BYTES >> 20} MiB a chat template may take; {_FIX}"
        )
    if hashlib.sha256(data).hexdigest() != expected:
        raise PackageError(
            f"{origin} differs from the manifest's hash; rebuild it with `aotc build --force`"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PackageError(f"{origin} is not UTF-8 text; {_FIX}") from None


def _kind(value: Any) -> str:
    return "missing" if value is None else f"a {type(value).__name__}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200].rstrip(".") if text else type(exc).__name__
