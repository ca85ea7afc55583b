"""How much a tokenizer.json may grow the text it rewrites, checked before the `tokenizers` library
reads it (at export, and again when a package's tokenizer is loaded).

A tokenizer's normalizer, pre-tokenizer and decoder may replace text (`Replace`) and add to it
(`Prepend`, `Append`): in real tokenizers by a character or two (Llama's " " -> "▁" and back,
Metaspace's "▁"). A crafted one that replaces "a" by megabytes makes a one-character prompt cost
gigabytes and seconds in the library, where no later bound can stop it. So a replacement may make
its text at most MAX_GROWTH times as long, counted over every Replace of a stage together (a
chain of them multiplies), and what a stage adds is at most MAX_ADDED_CHARS.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MAX_GROWTH = 16  # real tokenizers: 1 (one character for one)
MAX_ADDED_CHARS = 256  # real tokenizers: 1 ("▁")
STAGES = ("normalizer", "pre_tokenizer", "decoder")
# the node types that add text, and the field holding it
ADDING = {"Prepend": "prepend", "Append": "append"}


def tokenizer_growth_problem(data: Any) -> str | None:
    """What in a parsed tokenizer.json grows text past the bounds, or None."""
    if not isinstance(data, dict):
        return None
    for stage in STAGES:
        growth, added = 1, 0
        for node in _nodes(data.get(stage)):
            kind = node.get("type")
            if kind == "Replace":
                content = node.get("content")
                pattern = _pattern_text(node.get("pattern"))
                shortest = len(pattern) if pattern else 1  # a regex may match one character
                if isinstance(content, str) and len(content) > shortest:
                    growth *= -(-len(content) // shortest)  # ceil
            elif kind in ADDING and isinstance(node.get(ADDING[kind]), str):
                added += len(node[ADDING[kind]])
            if growth > MAX_GROWTH:
                return (
                    f"its {stage} replaces text with text up to {growth} times as long (a Replace "
                    f"of {len(str(node.get('content')))} characters); aotc takes at most "
                    f"{MAX_GROWTH} times (real tokenizers replace one character with one)"
                )
            if added > MAX_ADDED_CHARS:
                return (
                    f"its {stage} adds {added} characters to every text; aotc takes at most "
                    f"{MAX_ADDED_CHARS} (real tokenizers add one)"
                )
    return None


def _pattern_text(pattern: Any) -> str | None:
    """A Replace pattern's literal text ({"String": "a"}); None for a regex (matches may be 1
    character long)."""
    if isinstance(pattern, dict) and isinstance(pattern.get("String"), str):
        return str(pattern["String"])
    return None


def _nodes(tree: Any, depth: int = 0) -> Iterator[dict]:
    """Every node of a stage, nested Sequences included, in order."""
    if depth > 64:  # the JSON parser bounds nesting; a real stage is two levels deep
        return
    if isinstance(tree, dict):
        yield tree
        for key in ("normalizers", "pretokenizers", "decoders"):
            for child in tree.get(key) or ():
                yield from _nodes(child, depth + 1)
    elif isinstance(tree, list):
        for child in tree:
            yield from _nodes(child, depth + 1)
