"""Inductor options for one build: the mode preset, then --config, then --option (last wins)."""

from __future__ import annotations

import difflib

from aotc.compiler.cpu_isa import isa_options
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


# How the package holds its weights, whatever the mode: in a blob file beside the model's shared
# object, not inside it. torch's AOTInductor runner never unloads a shared object it opened (and
# each load extracts a fresh copy), so weights inside it stayed mapped after every unload: 20
# load/unload cycles of a 16 MB model grew RSS by 341 MB; with the blob, by 21 MB (code and
# relocations only), with the same load time (docs/reliability.md).
PACKAGING_OPTIONS = {
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.package_constants_on_disk_format": "binary_blob",
}


# What a text-generation step builds with on CUDA unless --config or --option says otherwise. A
# decode step at batch 1 is bound by its kernel launches, not its bytes (SmolLM2-135M's shape: 415
# kernels, 1.15 ms a step for 65 us of reading), and each layer has independent small kernels side
# by side (RoPE on the queries beside RoPE and the cache write of the keys, the values' write).
# Combo kernels put such siblings in one launch: 415 -> 366 kernels and 1.146 -> 1.048 ms a step
# on an H200 (docs/benchmarks.md). One-call models keep torch.compile's defaults.
GENERATION_CUDA_OPTIONS = {"combo_kernels": True}


def generation_options(device: str, options: dict) -> dict:
    """`options` with the text-generation defaults of `device` under them (theirs win)."""
    defaults = GENERATION_CUDA_OPTIONS if device == "cuda" else {}
    known = known_options()
    return dict(sorted({**{k: v for k, v in defaults.items() if k in known}, **options}.items()))


def packaging_options() -> dict:
    """PACKAGING_OPTIONS this torch knows (an older Inductor keeps its weights in the .so)."""
    known = known_options()
    return {key: value for key, value in PACKAGING_OPTIONS.items() if key in known}


def known_options() -> set:
    from torch._inductor import config

    return set(config.get_config_copy().keys())


def resolve_options(cfg: BuildConfig) -> dict:
    """The exact Inductor options this build uses (recorded in the manifest)."""
    options = {
        **preset_inductor_options(cfg.mode, cfg.device),
        **packaging_options(),
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
