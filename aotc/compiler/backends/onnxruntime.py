"""`aotc build --backend onnxruntime`: an artifact (.pt2, converted first) or an ONNX model written
by `aotc export --format onnx` -> a package whose model is the ONNX graph as ONNX Runtime optimized
it at build, with the same manifest, hashes, signature and numeric check as an AOTInductor package.

The graph is optimized once, here, at ONNX Runtime's highest level ("all": constant folding,
fusions, and the NCHWc layout transforms that depend on the CPU's vector width); the runtime loads it
with optimization off. Such a graph is tied to the machine it was optimized on: the manifest says so
(`backend_options.tied_to_hardware`) and records the vector extensions it assumed
(`device.cpu_features`), which a runtime checks like an AOTInductor package's.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from aotc.compiler.finish import finish
from aotc.compiler.manifest import new_manifest
from aotc.compiler.package_writer import (
    output_lock,
    staging_folder,
    write_manifest,
    write_tokenizer,
)
from aotc.compiler.state_file import write_state
from aotc.compiler.tolerances import tolerance
from aotc.compiler.verify import check_numerics
from aotc.config import BuildConfig, Mode, Precision
from aotc.errors import BuildError, UserInputError
from aotc.export.artifact import ArtifactMeta, load_artifact
from aotc.export.cached_attention import lower_cached_attention
from aotc.export.eager_reference import CALLS_PER_CASE
from aotc.export.onnx import (
    export_to_onnx,
    read_onnx_model,
    require_onnx,
    set_metadata,
    unoptimized_outputs,
)
from aotc.export.user_frames import first_line
from aotc.progress import Progress
from aotc.quiet import quiet_torch

OPTIMIZATION_LEVEL = "all"
# The CPU extensions ONNX Runtime's optimized layouts depend on (MLAS picks its NCHWc block size,
# 8 or 16 floats, from them).
VECTOR_FEATURES = ("avx2", "avx512f")


def check_config(cfg: BuildConfig) -> None:
    problems = []
    if cfg.device == "cuda":
        problems.append("--backend onnxruntime builds CPU packages (this onnxruntime has no CUDA)")
    if cfg.mode != Mode.DEFAULT:
        problems.append(
            f"--mode {cfg.mode.value} is an Inductor mode; --backend onnxruntime takes none"
        )
    if cfg.precision != Precision.FP32:
        problems.append("--backend onnxruntime builds fp32 packages")
    if cfg.options or cfg.cpu_isa != "native":
        problems.append(
            "--option and --cpu-isa are Inductor settings; --backend onnxruntime takes none"
        )
    if problems:
        raise UserInputError("; ".join(problems))


def build(cfg: BuildConfig, progress: Progress, started: float):
    require_onnx()
    check_config(cfg)
    cfg = dataclasses.replace(cfg, device="cpu")
    source_is_onnx = Path(cfg.artifact).suffix == ".onnx"
    with output_lock(cfg.output), staging_folder(cfg.output) as staging:
        ep = None
        if source_is_onnx:
            with progress.stage(f"reading {cfg.artifact}"):
                model, info = read_onnx_model(cfg.artifact)
            meta = ArtifactMeta.new(model=info.model, signature=info.signature)
            if info.signature.get("state"):
                raise UserInputError(
                    "this model carries state between calls; build it from its .pt2 artifact "
                    "(aotc build MODEL.pt2 --backend onnxruntime), which holds the initial state"
                )
        else:
            with progress.stage(f"loading {cfg.artifact}"):
                ep, meta = load_artifact(cfg.artifact)
            with progress.stage("converting to ONNX (torch.onnx, dynamo exporter)"):
                converted = staging / "source.onnx"
                # a generation step's attention as plain aten ops, which ONNX has
                export_to_onnx(lower_cached_attention(ep, "reference"), meta, converted)
                model, info = read_onnx_model(converted)
                converted.unlink()
        # the program's signature, for the check's eager reference; the package's is the ONNX
        # model's, whose state (if any) is returned, not updated in place (export_to_onnx)
        program_signature = meta.signature
        meta = dataclasses.replace(meta, signature=info.signature)
        manifest = _manifest(cfg, meta, model)
        from aotc_runtime import CONTRACT_KEY, model_contract

        set_metadata(model, {CONTRACT_KEY: json.dumps(model_contract(manifest), sort_keys=True)})
        with progress.stage(f"optimizing with ONNX Runtime (level {OPTIMIZATION_LEVEL})"):
            optimize(model, staging / manifest.model_file)
        if ep is not None and meta.signature.get("state"):
            write_state(ep, meta.signature, staging)
        write_tokenizer(cfg.artifact, manifest.generation, staging)
        manifest = dataclasses.replace(
            manifest, build_seconds=round(time.perf_counter() - started, 2)
        )
        manifest = write_manifest(staging, manifest)  # hashed once: finish keeps these
        atol, rtol = tolerance("fp32", "cpu", cfg.atol, cfg.rtol)
        with (
            progress.stage("checking the package against its reference in a child process"),
            quiet_torch(),
        ):
            reference = None if ep is not None else onnx_reference(model)
            if ep is not None:
                from aotc.export.placement import place_program

                ep = place_program(ep, "cpu", Precision.FP32, program_signature)
            check = check_numerics(
                ep,
                program_signature,
                staging,
                "cpu",
                atol,
                rtol,
                cfg.allow_mismatch,
                reference=reference,
                fix="build it with the AOTInductor backend (no --backend), loosen --atol/--rtol, or "
                "pass --allow-mismatch to keep the package anyway",
                # a generation step is checked on the calls a generation makes: random rows and
                # positions would feed one position twice, which no generation does
                task=meta.task if ep is not None else None,
            )
        return finish(staging, manifest, check, cfg.output, started, progress)


def _manifest(cfg: BuildConfig, meta: ArtifactMeta, model):
    import onnx
    import onnxruntime

    from aotc_runtime import cpu_features

    here = cpu_features() or set()
    features = tuple(f for f in VECTOR_FEATURES if f in here)
    tools = {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
    tools["opset"] = max(
        (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None
    )
    manifest = new_manifest(cfg, meta, {}, tools, features)
    return dataclasses.replace(
        manifest,
        backend="onnxruntime",
        backend_options={
            "onnxruntime": onnxruntime.__version__,
            "optimization_level": OPTIMIZATION_LEVEL,
            "tied_to_hardware": True,
        },
        inductor_options={},
    )


def optimize(model, target: Path) -> None:
    """ONNX Runtime's offline optimization: the session writes the optimized graph to `target`."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(target)
    # its warning that the result is hardware specific is in the manifest
    options.log_severity_level = 3
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own exception types
        raise BuildError(
            f"ONNX Runtime could not optimize the model: {first_line(exc)[:300]}; build it with the "
            "AOTInductor backend (no --backend)"
        ) from None
    optimized = onnx.load(str(target))
    # ONNX Runtime keeps the model's metadata; make sure, the runtime's checks read it
    wanted = {p.key: p.value for p in model.metadata_props}
    if {p.key: p.value for p in optimized.metadata_props} != wanted:
        set_metadata(optimized, wanted)
        onnx.save_model(optimized, str(target))


def onnx_reference(model):
    """The ONNX model as exported, run by ONNX Runtime with no graph optimization: the reference of
    a build from an .onnx file (which has no program to run eagerly; its export checked it)."""

    def run(cases):
        # the package is called CALLS_PER_CASE times per case; the reference answers each call
        return [out for out in unoptimized_outputs(model, cases) for _ in range(CALLS_PER_CASE)]

    return ("the exported ONNX model run by ONNX Runtime without graph optimization", run)
