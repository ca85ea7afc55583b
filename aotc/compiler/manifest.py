"""The one place a package's manifest is made (the format itself: aotc_runtime.Manifest and
docs/package-format.md). The build fills in what it measured with dataclasses.replace."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from aotc import __version__
from aotc.config import BuildConfig, Precision, preset_runtime
from aotc.export.artifact import ArtifactMeta
from aotc_runtime import (
    HASH_FIELD,
    Device,
    Generation,
    Manifest,
    RuntimeSettings,
    Signature,
    Source,
    Toolchain,
    gpu_description,
    running_environment,
    sha256_file,
)
from aotc_runtime.manifest import format_version_for


def new_manifest(
    cfg: BuildConfig,
    meta: ArtifactMeta,
    options: dict,
    compiler_record: dict,
    cpu_features: tuple[str, ...] = (),
) -> Manifest:
    """The manifest of a package about to be compiled: no files, no timings, numeric check pending.
    `cpu_features`: the CPU extensions its C++ is compiled to use (aotc/compiler/cpu_isa.py)."""
    running = running_environment()
    build_tools = dict(compiler_record)
    # CUDA packages carry host C++ too (the wrapper that launches the kernels), compiled alike.
    device = Device(
        cfg.device,
        cfg.requested_device or cfg.device,
        cpu_isa=cfg.cpu_isa,
        cpu_features=cpu_features,
    )
    if cfg.device == "cuda":
        import torch

        gpu = gpu_description(torch.cuda.current_device())
        device = dataclasses.replace(
            device, gpu_name=gpu["gpu_name"], compute_capability=gpu["compute_capability"]
        )
        build_tools["triton"] = triton_version()
    preset = preset_runtime(cfg.mode)
    signature = Signature.from_json(meta.signature)
    varies = {
        "fields": ["created", "build_seconds", "build_phases", HASH_FIELD],
        "why": "they record the build as an event (when, how long), and the hash covers them; "
        "the model files are byte-identical",
    }
    return Manifest(
        aotc_version=__version__,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        model=meta.model,
        source=Source(str(Path(cfg.artifact).resolve()), sha256_file(cfg.artifact)),
        toolchain=Toolchain(
            running["torch"], running["python"], running["platform"], running["cuda"], build_tools
        ),
        device=device,
        mode=cfg.mode.value,
        precision=cfg.precision.value,
        inductor_options=dict(options),
        runtime=RuntimeSettings(
            cuda_graphs=bool(preset.get("cuda_graphs")) and cfg.device == "cuda",
            tf32=cfg.precision == Precision.TF32,
            cudnn_benchmark=cfg.cudnn_benchmark and cfg.device == "cuda",
        ),
        signature=signature,
        format_version=format_version_for(signature),
        files={},
        build_seconds=0.0,
        numeric_check=None,
        varies_per_build=varies,
        generation=generation_record(meta.task),
    )


def triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


TOKENIZER_FILE = "tokenizer.json"  # where a text-generation package keeps its tokenizer
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # and its chat template


def generation_record(task: dict | None) -> Generation | None:
    """The manifest's `generation` from the artifact's --task record (None for one-call models)."""
    if not task or task.get("name") != "text-generation":
        return None
    return Generation(
        batch_size=task["batch_size"],
        max_seq_len=task["max_seq_len"],
        vocab_size=task["vocab_size"],
        eos_token_ids=tuple(task.get("eos_token_ids", ())),
        pad_token_id=task.get("pad_token_id"),
        tokenizer=TOKENIZER_FILE if task.get("tokenizer") else None,
        sliding_window=task.get("sliding_window"),
        step_format=task.get("step_format"),
        chat_template=CHAT_TEMPLATE_FILE if task.get("chat_template") else None,
        # the names the template is rendered with: nothing else reads them
        special_tokens=dict(task.get("special_tokens") or {}) if task.get("chat_template") else {},
        sampling_defaults=dict(task.get("sampling_defaults") or {}),
    )
