"""The last step of every backend's build, and what a build returns.

`finish` writes the numeric check's record and the final manifest, then renames the staging folder
into place; a tuned build (aotc/tune) assembles its package itself and returns the same
BuildResult.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from aotc.compiler.package_writer import commit, write_manifest
from aotc_runtime import Manifest


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


def finish(
    staging: Path, manifest: Manifest, check, output: Path, started: float, progress
) -> BuildResult:
    """The check's record, the final manifest, the rename into place (inside the caller's output
    lock and staging folder)."""
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
    stages = progress.breakdown()  # the keyed stages (none for the ONNX backend's)
    progress.note(
        f"wrote {output} in {manifest.build_seconds:.1f}s" + (f" ({stages})" if stages else "")
    )
    return BuildResult(output, manifest)


STAGE_PREFIX = "aotc."  # build_phases keys of aotc's stages (the rest are Inductor's timers)


def stage_phases(progress) -> dict:
    seconds = getattr(progress, "seconds", {})
    return {f"{STAGE_PREFIX}{k}": {"seconds": round(v, 2), "calls": 1} for k, v in seconds.items()}
