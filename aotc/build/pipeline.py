"""`aotc build`: export artifact -> package folder (compiled model + manifest.json).

What every build shares: the device resolved and the config checked, a tuned or specialized build
handed to aotc/tune, the others to their backend (aotc/build/backends/: AOTInductor, ONNX Runtime),
each of which ends with `finish` here (the check's record, the final manifest, the rename into
place).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from aotc.build.backends import backend
from aotc.build.package_writer import commit, write_manifest
from aotc.config import BuildConfig, Mode, resolve_device
from aotc.errors import UserInputError
from aotc.export.call_structure import initial_state
from aotc.progress import Progress
from aotc_runtime import STATE_FILE, Manifest


@dataclass
class BuildResult:
    output: Path
    manifest: Manifest

    def to_dict(self) -> dict:
        m = self.manifest
        return {
            "package": str(self.output),
            "mode": m.mode,
            "device": m.device.to_json(),
            "precision": m.precision,
            "build_seconds": m.build_seconds,
            "size_bytes": m.size_bytes,
            "numeric_check": m.numeric_check.to_json() if m.numeric_check else None,
        }


def build_package(cfg: BuildConfig, progress: Progress | None = None) -> BuildResult:
    progress = progress or Progress()
    started = time.perf_counter()
    cfg, resolved = resolve_device(cfg)  # auto -> cpu/cuda first: validate() judges the real target
    if resolved:
        progress.note(resolved)
    cfg.validate()
    if cfg.tune or cfg.specialize:
        from aotc.export.artifact import read_artifact_meta
        from aotc.tune.driver import build_tuned

        if Path(cfg.artifact).suffix == ".pt2" and read_artifact_meta(Path(cfg.artifact)).task:
            # its members would be other generation steps, with a loop of their own to check
            raise UserInputError(
                f"{cfg.artifact} is a text-generation artifact: --tune and --specialize do not "
                "build those yet; build it without them"
            )

        return build_tuned(cfg, progress)
    return backend(cfg.backend).build(cfg, progress, started)


def finish(
    staging: Path, manifest: Manifest, check, output: Path, started: float, progress
) -> BuildResult:
    """The last step of every backend's build: the check's record, the final manifest, the rename
    into place (inside the caller's output lock and staging folder)."""
    # files hashed before the check are kept (the check changes none): hashing reads the whole
    # package, 0.5 GB for a 120M model in fp32
    manifest = write_manifest(
        staging,
        dataclasses.replace(
            manifest,
            numeric_check=check,
            build_seconds=round(time.perf_counter() - started, 2),
            size_bytes=(staging / manifest.model_file).stat().st_size,
            # aotc's own stages beside Inductor's timers: where the build's time went
            build_phases={**stage_phases(progress), **manifest.build_phases},
        ),
        hash_files=not manifest.files,
    )
    commit(staging, output)
    progress.note(f"wrote {output} in {manifest.build_seconds:.1f}s")
    return BuildResult(output, manifest)


STAGE_PREFIX = "aotc."  # build_phases keys of aotc's stages (the rest are Inductor's timers)


def stage_phases(progress) -> dict:
    seconds = getattr(progress, "seconds", {})
    return {f"{STAGE_PREFIX}{k}": {"seconds": round(v, 2), "calls": 1} for k, v in seconds.items()}


def write_state(ep, signature: dict, folder: Path, precision=None) -> None:
    """The initial state the runtime carries between calls, as plain tensors (loaded with weights_only).

    A tensor of one value throughout (a KV cache starts all zeros) is saved as that value expanded
    to its shape: one element on disk, read back by both runtimes as a stride-0 view that their
    first clone makes whole. GPT-2 124M's cache for 1,024 positions would otherwise be 75 MB of
    zeros in a 500 MB package. A bf16/fp16 package keeps its floating state in that dtype
    (aotc/build/precision.py: state_in_precision)."""
    import torch

    from aotc.build.precision import state_in_precision
    from aotc.config import Precision

    state = state_in_precision(initial_state(ep, signature, "cpu"), precision or Precision.FP32)
    torch.save([compact(t) for t in state], folder / STATE_FILE)


def compact(tensor):
    """`tensor`, or its one value expanded to its shape when it holds one value throughout."""
    flat = tensor.reshape(-1)
    if flat.numel() < 2 or not bool((flat == flat[0]).all()):
        return tensor
    return flat[:1].clone().expand(tensor.shape)


__all__ = ["build_package", "BuildResult", "Mode"]
