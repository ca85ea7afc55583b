"""What a text-generation package carries from a transformers tokenizer folder besides
tokenizer.json: the chat template and the special tokens it is rendered with.

The template is found where transformers' tokenizers find their default one: chat_template.jinja,
else the `chat_template` key of tokenizer_config.json (a string, or a list of {"name",
"template"} of which "default" is the one apply_chat_template uses). The special tokens are
tokenizer_config.json's bos/eos/pad/unk tokens (a string, or an AddedToken object whose
"content" is the text), else special_tokens_map.json's. Nothing here runs code: the files are
read as text and JSON, bounded in size; the template is rendered only by the runtime, in a
sandbox (aotc_runtime/chat_template.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aotc.errors import UserInputError
from aotc.export.folder_json import read_bounded_text, read_json_object

CHAT_TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
MAX_CHAT_TEMPLATE_BYTES = 1 << 20  # real templates are a few KiB (tool-calling ones ~20 KiB)
MAX_SPECIAL_TOKEN_CHARS = 256  # the runtime's bound (aotc_runtime/generation_record.py)


@dataclass(frozen=True)
class TokenizerExtras:
    chat_template: str | None = None  # the template's text
    special_tokens: dict = field(default_factory=dict)  # name -> token text
    notes: tuple = ()  # what the export says of them, one line each


def read_tokenizer_extras(folder: Path) -> TokenizerExtras:
    """The chat template and special tokens of a tokenizer folder (both may be absent)."""
    folder = Path(folder)
    fix = f"save the tokenizer again (tokenizer.save_pretrained('{folder}'))"
    config_path = folder / "tokenizer_config.json"
    config = read_json_object(config_path, fix) if os.path.lexists(config_path) else {}
    template, notes = _chat_template(folder, config, fix)
    tokens = _special_tokens(config, config_path)
    map_path = folder / "special_tokens_map.json"
    if os.path.lexists(map_path):  # older folders keep them here; tokenizer_config.json wins
        tokens = {**_special_tokens(read_json_object(map_path, fix), map_path), **tokens}
    return TokenizerExtras(template, tokens, notes)


def _chat_template(folder: Path, config: dict, fix: str) -> tuple[str | None, tuple]:
    path = folder / CHAT_TEMPLATE_FILE
    if os.path.lexists(path):  # a link out of the folder or a FIFO is refused as it is read
        return read_bounded_text(path, MAX_CHAT_TEMPLATE_BYTES, fix), ()
    value = config.get("chat_template")
    where = f"{folder / 'tokenizer_config.json'}: chat_template"
    if value is None:
        return None, ()
    if isinstance(value, list):  # transformers' named templates: [{"name": ..., "template": ...}]
        for number, item in enumerate(value):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise UserInputError(
                    f'{where}[{number}] is not a named template (an object whose "name" is a '
                    f"string); {fix}"
                )
        named = {item["name"]: item.get("template") for item in value}
        if "default" not in named:
            return None, (
                f"{where} names templates ({', '.join(map(str, list(named)[:4]))}) but none "
                "'default', the one transformers uses; the package carries no chat template",
            )
        value = named["default"]
    if not isinstance(value, str):
        raise UserInputError(f"{where} is not a template (a string); {fix}")
    if len(value.encode("utf-8")) > MAX_CHAT_TEMPLATE_BYTES:
        raise UserInputError(
            f"{where} is over the {MAX_CHAT_TEMPLATE_BYTES >> 20} MiB a chat template may take; {fix}"
        )
    return value, ()


def _special_tokens(config: dict, where: Path) -> dict:
    tokens = {}
    for name in SPECIAL_TOKENS:
        value: Any = config.get(name)
        if isinstance(value, dict):  # an AddedToken as transformers serializes it
            value = value.get("content")
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > MAX_SPECIAL_TOKEN_CHARS:
            raise UserInputError(
                f"{where}: {name} is not a token's text (a string of at most "
                f"{MAX_SPECIAL_TOKEN_CHARS} characters); save the tokenizer again"
            )
        tokens[name] = value
    return tokens
