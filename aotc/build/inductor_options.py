"""Inductor options for one build: the mode preset, then --config, then --option (last wins)."""

from __future__ import annotations

import difflib

from aotc.build.cpu_isa import isa_options
from aotc.config import BuildConfig, preset_inductor_options
from aotc.errors import UserInputError


def parse_option(text: str) -> tuple[str, object]:
    """'max_autotune=true' -> ('max_autotune', True). Values are read as YAML scalars."""
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"option '{text}' must look like key=value, e.g. max_autotune=true")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def known_options() -> set:
    from torch._inductor import config

    return set(config.get_config_copy().keys())


def resolve_options(cfg: BuildConfig) -> dict:
    """The exact Inductor options this build uses (recorded in the manifest)."""
    options = {
        **preset_inductor_options(cfg.mode, cfg.device),
        **isa_options(cfg.cpu_isa),
        **cfg.options,
    }
    known = known_options()
    unknown = [key for key in options if key not in known]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        raise UserInputError(
            f"unknown Inductor option {', '.join(hints)}; see torch._inductor.config for the names"
        )
    return dict(sorted(options.items()))
