"""A saved Hugging Face model folder (what `save_pretrained` writes) as the model to export.

The model is built from config.json with transformers' own classes (the config class its
`model_type` names, then AutoModelForCausalLM.from_config) and its weights are read from
safetensors files, one or sharded under model.safetensors.index.json, as vLLM and optimum load
a local folder. Nothing from the folder runs: a config that names custom code (`auto_map`), a
folder holding Python files, quantized checkpoints (their loaders are code paths of their own)
and pickle-only weights (pytorch_model.bin) are refused in one line that says what works
instead. Every file read is a regular file of the folder (folder_json.folder_file: no link out of
it, no FIFO) and bounded: the JSON files by size, the shards by count and by this machine's memory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aotc.errors import ModelError, UserInputError
from aotc.export.folder_config import check_config_values
from aotc.export.folder_json import folder_file, read_json_object
from aotc.export.loaded_model import LoadedModel
from aotc.export.user_frames import first_line
from aotc.export.weights import WeightsMismatch, copy_weights, safetensors_tensors

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_FOLDER_ENTRIES = 10_000  # a model folder holds tens of files
MAX_SHARDS = 4096  # the largest published checkpoints have a few hundred
MODEL_DTYPES = ("float32", "bfloat16", "float16")
# the attention every model is built with: transformers' own, never a kernel named by the folder
# (attn_implementation may name a Hub kernel, which transformers would download and run)
ATTENTION = "sdpa"


def is_model_folder(target: str) -> bool:
    return Path(target).is_dir()


def load_model_folder(folder: Path, dtype: str | None = None) -> LoadedModel:
    """The causal LM saved in `folder`, with its weights and generation config, in `dtype`
    (default: the config's dtype or torch_dtype, else float32), in eval mode."""
    folder = Path(folder)
    names = folder_entries(folder)
    config_data = read_config(folder, names)
    weights = weight_files(folder, names)
    check_layers_fit_weights(folder, config_data, weights)
    model = build_model(folder, config_data, model_dtype(folder, config_data, dtype))
    try:
        copy_weights(model, safetensors_tensors(weights))
    except WeightsMismatch as exc:
        raise UserInputError(
            f"{folder}'s weights do not fit {type(model).__name__} as its config.json describes "
            f"it: {exc}; {_FROM_PRETRAINED_FIX.format(folder=folder)}"
        ) from None
    except Exception as exc:  # safetensors' own errors: a damaged or truncated file
        raise UserInputError(
            f"{folder}: its safetensors weights cannot be read ({first_line(exc)[:160]}); "
            "save the model again (model.save_pretrained)"
        ) from None
    model.generation_config = generation_config(folder, names, model)
    return LoadedModel(model.eval(), str(folder), ())


# What works when transformers can load a folder that aotc's loader does not take: a model file.
_FROM_PRETRAINED_FIX = (
    "if transformers loads it, export a model file instead: lm.py with get_model() returning "
    "AutoModelForCausalLM.from_pretrained('{folder}'), then `aotc export lm.py --task "
    "text-generation --max-seq-len N`"
)


def folder_entries(folder: Path) -> set[str]:
    names: set[str] = set()
    for entry in os.scandir(folder):
        names.add(entry.name)
        if len(names) > MAX_FOLDER_ENTRIES:
            raise UserInputError(
                f"{folder} holds more than {MAX_FOLDER_ENTRIES} files, which is not a model folder; "
                "pass the folder save_pretrained wrote"
            )
    return names


def read_config(folder: Path, names: set[str]) -> dict:
    """config.json, refused when it names code or a quantized checkpoint."""
    if CONFIG_FILE not in names:
        raise UserInputError(
            f"{folder} has no config.json, so it is not a saved transformers model; pass the "
            "folder model.save_pretrained() wrote, or a model file (model.py)"
        )
    data = read_json_object(folder / CONFIG_FILE, "save the model again (model.save_pretrained)")
    trusted_fix = (
        "aotc never runs code from a model folder; if you trust it, export a model file: lm.py "
        f"with get_model() returning AutoModelForCausalLM.from_pretrained('{folder}', "
        "trust_remote_code=True), then `aotc export lm.py --task text-generation --max-seq-len N`"
    )
    if "auto_map" in data:
        shown = (
            ", ".join(map(str, data["auto_map"]))[:80] if isinstance(data["auto_map"], dict) else ""
        )
        raise UserInputError(
            f"{folder}/config.json names custom model code (auto_map: {shown}); {trusted_fix}"
        )
    code = sorted(name for name in names if name.endswith(".py"))
    if code:
        raise UserInputError(
            f"{folder} holds Python code ({', '.join(code[:3])}), the model's own classes; "
            f"{trusted_fix}"
        )
    if data.get("quantization_config") is not None:
        method = data["quantization_config"]
        method = method.get("quant_method") if isinstance(method, dict) else None
        raise UserInputError(
            f"{folder} is a quantized checkpoint ({method or 'quantization_config'}), which aotc "
            "does not load; export the unquantized model and quantize at build (`aotc build "
            "--quantize int8-weight-only`)"
        )
    return data


def weight_files(folder: Path, names: set[str]) -> list[Path]:
    """model.safetensors, else the shards model.safetensors.index.json lists; refused: pickle
    weights only, no weights, an index naming files outside the folder or too many."""
    if SINGLE_WEIGHTS in names:
        files = [folder / SINGLE_WEIGHTS]
    elif WEIGHTS_INDEX in names:
        files = _shards(folder, names)
    else:
        pickled = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
        if pickled:
            raise UserInputError(
                f"{folder} holds its weights only as pickle files ({', '.join(pickled[:2])}), which "
                "run code when read; aotc reads safetensors only: where you trust the file, convert "
                'it with `python -c "from transformers import AutoModelForCausalLM as M; '
                f"M.from_pretrained('{folder}').save_pretrained('{folder}-safetensors')\"` and export "
                f"{folder}-safetensors"
            )
        raise UserInputError(
            f"{folder} has no {SINGLE_WEIGHTS} or {WEIGHTS_INDEX}; save the model with "
            "model.save_pretrained(), which writes them"
        )
    files = [folder_file(path) for path in files]  # regular files of the folder, links refused
    _check_fits_memory(folder, files)
    return files


def _shards(folder: Path, names: set[str]) -> list[Path]:
    fix = "save the model again (model.save_pretrained)"
    index = read_json_object(folder / WEIGHTS_INDEX, fix)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserInputError(f"{folder / WEIGHTS_INDEX} has no weight_map of names to files; {fix}")
    shards = sorted({str(file) for file in weight_map.values()})
    if len(shards) > MAX_SHARDS:
        raise UserInputError(
            f"{folder / WEIGHTS_INDEX} lists {len(shards)} files, more than the {MAX_SHARDS} "
            f"aotc reads; {fix} with a larger max_shard_size"
        )
    for shard in shards:
        # a plain file of this folder: the index is the folder's, not a pointer elsewhere
        if (
            "/" in shard
            or "\\" in shard
            or shard in (".", "..")
            or not shard.endswith(".safetensors")
        ):
            raise UserInputError(
                f"{folder / WEIGHTS_INDEX} names {shard[:80]!r}, not a .safetensors file of the "
                f"folder; {fix}"
            )
        if shard not in names:
            raise UserInputError(
                f"{folder / WEIGHTS_INDEX} lists {shard}, which is not in the folder; {fix}"
            )
    return [folder / shard for shard in shards]


# config.json's names for the count of decoder layers, at its top or in its text_config
LAYER_COUNT_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def check_layers_fit_weights(folder: Path, config: dict, files: list[Path]) -> None:
    """Refuse a config whose layer count the weight files cannot fill, before the model is built:
    transformers makes every layer it names (20,000 take 1.7 GB, 10^400 never end), and each layer
    has weights of its own, so a real checkpoint holds more tensors than layers. Only the
    safetensors headers are read."""
    fix = "save the model again (model.save_pretrained)"
    sections = [("", config)]
    if isinstance(config.get("text_config"), dict):
        sections.append(("text_config.", config["text_config"]))
    counts = [(where + name, section[name]) for where, section in sections
              for name in LAYER_COUNT_FIELDS if name in section]  # fmt: skip
    if not counts:
        return
    tensors = sum(1 for _name in safetensors_names(files))
    for field, value in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserInputError(
                f"{folder}/config.json gives {field} {str(value)[:40]}, not a positive whole "
                f"number of layers; {fix}"
            )
        if value > tensors:
            raise UserInputError(
                f"{folder}/config.json gives {field} {str(value)[:40]}, but its weight files hold "
                f"{tensors} tensors, fewer than one a layer: the config does not describe these "
                f"weights; {fix}"
            )


def safetensors_names(files: list[Path]):
    """The tensor names in these safetensors files' headers (no tensor is read)."""
    from safetensors import safe_open

    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                yield from handle.keys()
        except Exception as exc:  # safetensors' own errors: a damaged or truncated header
            raise UserInputError(
                f"{path} cannot be read as safetensors ({first_line(exc)[:160]}); save the model "
                "again (model.save_pretrained)"
            ) from None


def _check_fits_memory(folder: Path, files: list[Path]) -> None:
    total = sum(path.stat().st_size for path in files)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if total > memory:
        raise UserInputError(
            f"{folder}'s weights are {total / 2**30:.1f} GiB, more than this machine's "
            f"{memory / 2**30:.1f} GiB of memory; export it on a machine with more"
        )


def model_dtype(folder: Path, config: dict, override: str | None) -> str:
    """--dtype if given, else the config's `dtype` (`torch_dtype` before transformers 5), else
    float32 (what transformers' from_config makes when the config names none)."""
    if override is not None:
        return override
    named = config.get("dtype", config.get("torch_dtype"))
    if named is None or named == "auto":
        return "float32"
    if named not in MODEL_DTYPES:
        raise UserInputError(
            f"{folder}/config.json gives dtype {str(named)[:40]!r}, not one of "
            f"{', '.join(MODEL_DTYPES)}; pass --dtype float32 (or bfloat16, float16)"
        )
    return str(named)


def build_model(folder: Path, data: dict, dtype: str) -> Any:
    """AutoModelForCausalLM of the config, its parameters left uninitialized (the weights fill
    every one of them, or the load is refused: weights.copy_weights)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from aotc.export.transformers_release import warn_if_untested

    warn_if_untested()
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise UserInputError(
            f"{folder}/config.json's model_type {str(model_type)[:40]!r} is not a model "
            f"transformers {transformers.__version__} knows; install a transformers that has it"
        )
    check_config_values(folder, data, CONFIG_MAPPING[model_type])
    try:
        config = CONFIG_MAPPING[model_type].from_dict(data)
    except Exception as exc:
        raise UserInputError(
            f"{folder}/config.json is not a valid {model_type} config ({first_line(exc)[:160]}); "
            "save the model again (model.save_pretrained)"
        ) from None
    try:
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(
                config, dtype=getattr(torch, dtype), attn_implementation=ATTENTION
            )
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise ModelError(
                f"building {model_type} from {folder}/config.json failed: {first_line(exc)}"
            ) from exc
        raise UserInputError(
            f"{folder} holds a {model_type} model, which has no causal LM class in transformers "
            "(AutoModelForCausalLM); --task text-generation takes a decoder language model"
        ) from None
    except Exception as exc:
        raise ModelError(
            f"building {model_type} from {folder}/config.json failed: {type(exc).__name__}: "
            f"{first_line(exc)}"
        ) from exc
    # no_init_weights skips init_weights, which is also where transformers ties lm_head to the
    # embedding (tie_word_embeddings): tie them here, so the one saved copy fills both
    model.tie_weights()
    return model


def generation_config(folder: Path, names: set[str], model: Any) -> Any:
    """generation_config.json when the folder has one (its eos_token_id, maybe a list, is what
    generation stops at), else the one transformers made from config.json."""
    from transformers import GenerationConfig

    if GENERATION_CONFIG_FILE not in names:
        return model.generation_config
    fix = "save it again (model.generation_config.save_pretrained)"
    data = read_json_object(folder / GENERATION_CONFIG_FILE, fix)
    try:
        return GenerationConfig.from_dict(data)
    except Exception as exc:
        raise UserInputError(
            f"{folder / GENERATION_CONFIG_FILE} is not a generation config ({first_line(exc)[:160]}); {fix}"
        ) from None
