"""A package's chat template: a conversation (a list of {role, content} messages) rendered into the
prompt the model was trained on, as transformers' `apply_chat_template` renders and tokenizes it.

The template is the package's `chat_template.jinja` (manifest `generation.chat_template`, hashed
with every other file), rendered with the package's special tokens (`generation.special_tokens`:
bos_token, eos_token, ...) as transformers passes its tokenizer's. It came with a model folder, so
it is untrusted: it renders in template_sandbox.py's bounded sandbox, and what it refuses or
oversteps is one line. It compiles and renders in a process of its own (template_process.py), with
a capped address space and a deadline: a template cannot take the caller's memory or its time.

    template = ChatTemplate.of_package(package)       # None: the package carries no template
    ids = template.prompt_ids(package.tokenizer, [{"role": "user", "content": "Hi"}])
"""

from __future__ import annotations

import hashlib
import importlib.util
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
        if importlib.util.find_spec("jinja2") is None:  # said here: its process would only die
            raise MissingDependencyError("chat templates need jinja2; pip install jinja2")
        from .template_process import TemplateFailure, TemplateProcess

        try:
            self._process = TemplateProcess(text)
        except TemplateFailure as exc:
            raise self._problem(exc) from None

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
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The conversation as the prompt's text (apply_chat_template(tokenize=False)); `tools`
        as transformers passes them: OpenAI's {"type": "function", "function": {...}} objects."""
        check_messages(messages)
        from .template_process import TemplateFailure

        variables = {
            **self.special_tokens,
            "messages": [dict(m) for m in messages],
            "tools": [dict(tool) for tool in tools] if tools else None,
            "documents": None,
            "add_generation_prompt": bool(add_generation_prompt),
        }
        try:
            return self._process.render(variables)
        except TemplateFailure as exc:
            raise self._problem(exc) from None

    def close(self) -> None:
        """Stops the template's process (it also stops with this object, or its parent)."""
        self._process.close()

    def _problem(self, failure: Any) -> Exception:
        """A template_process.TemplateFailure as the error the caller reports: the package's
        problem (exit 7) for a template that is not Jinja or overstepped a bound, the messages'
        (exit 2) for one that refused them or failed on them."""
        kind, message = failure.kind, failure.message
        if kind == "syntax":
            return PackageError(f"{self.origin} is not a Jinja template ({message}); {_FIX}")
        if kind == "stopped":
            return PackageError(f"{self.origin} was stopped: {message}; {_FIX}")
        if kind == "refused":
            return GenerationInputError(f"{self.origin} refuses these messages: {message}")
        return GenerationInputError(f"{self.origin} failed on these messages ({message})")

    def prompt_ids(
        self,
        tokenizer: Any,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """The prompt's token ids, as apply_chat_template(tokenize=True) makes them: the rendered
        text encoded without the tokenizer's own special tokens (the template wrote them)."""
        text = self.render(messages, add_generation_prompt, tools)
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
