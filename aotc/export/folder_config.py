"""The values of a model folder's config.json that transformers builds the model from, checked
before it does. transformers takes most of them as they come: a negative size ends in "negative
dimension" deep in torch, an unknown RoPE type in a KeyError, a NaN epsilon in a model whose
every output is NaN. Each is refused here in one line that names the field (exit 2).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from aotc.errors import UserInputError

# Sizes every decoder has; each a whole number of at least 1 when given (null: the class default)
POSITIVE_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "max_position_embeddings",
    "head_dim",
    "n_embd",
    "n_head",
    "n_layer",
    "n_positions",
    "n_inner",
)
# RoPE types a config may name besides transformers' table of initializers: plain RoPE, and the
# older names some configs still carry (Phi-3's "su" for longrope, Qwen2-VL's "mrope")
PLAIN_ROPE = ("default", "su", "mrope")
FIX = "save the model again (model.save_pretrained)"


def check_config_values(folder: Path, data: dict, config_class: Any) -> None:
    """Refuse the first invalid value of config.json (and of its text_config) in one line."""
    where = f"{folder}/config.json"
    if isinstance(data.get("text_config"), dict) and "text_config" not in _sub_configs(
        config_class
    ):
        raise UserInputError(
            f"{where} has a text_config, which a {data.get('model_type')} config does not take "
            f"(its settings belong at the top of the file); {FIX}"
        )
    sections = [("", data)]
    if isinstance(data.get("text_config"), dict):
        sections.append(("text_config.", data["text_config"]))
    for prefix, section in sections:
        _check_section(where, prefix, section)


def _sub_configs(config_class: Any) -> dict:
    return dict(getattr(config_class, "sub_configs", None) or {})


def _check_section(where: str, prefix: str, section: dict) -> None:
    for name in POSITIVE_SIZES:
        value = section.get(name)
        if value is not None and not _whole(value, least=1):
            _refuse(where, prefix + name, value, "a whole number of at least 1")
    window = section.get("sliding_window")
    if window is not None and not _whole(window, least=0):
        _refuse(where, prefix + "sliding_window", window, "null or a whole number of positions")
    for name, value in section.items():
        if (name.endswith("_eps") or name.endswith("epsilon")) and value is not None:
            if not _finite(value) or value <= 0:
                _refuse(where, prefix + name, value, "a positive number")
    theta = section.get("rope_theta")
    if theta is not None and (not _finite(theta) or theta <= 0):
        _refuse(where, prefix + "rope_theta", theta, "a positive number")
    for name in ("rope_scaling", "rope_parameters"):
        if isinstance(section.get(name), dict):
            _check_rope(where, prefix + name, section[name])


def _check_rope(where: str, field: str, rope: dict) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = rope.get("rope_type", rope.get("type"))
    known = (*PLAIN_ROPE, *sorted(ROPE_INIT_FUNCTIONS))
    if kind is not None and kind not in known:
        raise UserInputError(
            f"{where}: {field}.rope_type {str(kind)[:40]!r} is not a RoPE type transformers knows "
            f"({', '.join(known)}); {FIX}"
        )
    for name in ("factor", "rope_theta"):
        value = rope.get(name)
        if value is not None and (not _finite(value) or value <= 0):
            _refuse(where, f"{field}.{name}", value, "a positive number")


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _refuse(where: str, field: str, value: Any, expected: str) -> None:
    raise UserInputError(f"{where}: {field} is {str(value)[:40]}, not {expected}; {FIX}")
