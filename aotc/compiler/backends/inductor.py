"""The AOTInductor backend (`aotc build`, the default): load the artifact, place it on the
device and precision, compile with AOTInductor, hash and write the manifest, load and run the
package in a child process against eager, then the shared `finish` (aotc/compiler/finish.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
import zipfile
from pathlib import Path

from aotc.compiler.cpu_isa import compiled_features, remembered_vec_isa_probes
from aotc.compiler.disk_space import check_space, full_device
from aotc.compiler.finish import STAGE_PREFIX, BuildResult, finish
from aotc.compiler.inductor_options import (
    PACKAGING_OPTIONS,
    generation_options,
    resolve_options,
)
from aotc.compiler.manifest import new_manifest
from aotc.compiler.package_writer import (
    output_lock,
    staging_folder,
    write_manifest,
    write_tokenizer,
)
from aotc.compiler.profile import TuningProgress, inductor_phase_times
from aotc.compiler.programmatic_launch import launched_prefixes, programmatic_launches
from aotc.compiler.ptxas import same_ptxas_as_workers
from aotc.compiler.reproducible import normalize_archive
from aotc.compiler.state_file import write_state
from aotc.compiler.tolerances import scale_relative, tolerance
from aotc.compiler.toolchain import compiler_options, use_compiler
from aotc.compiler.verify import check_numerics, reference_program
from aotc.config import BuildConfig, Precision, preset_runtime
from aotc.errors import BuildError, DiskFullError, UserInputError
from aotc.export.artifact import load_artifact, peek_artifact_meta
from aotc.export.cached_attention import implementation_for, lower_cached_attention
from aotc.export.fused_products import Fusions
from aotc.export.gptq import calibration_for
from aotc.export.placement import place_program, signature_in_precision
from aotc.export.user_frames import first_line
from aotc.kernels.product_tiles import tiles_in_force
from aotc.math_mode import tf32_matmuls
from aotc.progress import Progress
from aotc.quiet import quiet_torch
from aotc.stage_estimates import StageEstimates, build_kind
from aotc_runtime import CONTRACT_KEY, MODEL_FILE, model_contract


def build(cfg: BuildConfig, progress: Progress, started: float) -> BuildResult:
    if Path(cfg.artifact).suffix == ".onnx":
        raise UserInputError(
            f"{cfg.artifact} is an ONNX model: build it with --backend onnxruntime (AOTInductor "
            "builds .pt2 artifacts from `aotc export`)"
        )
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserInputError(
            "--device cuda but this machine has no usable CUDA GPU; build with --device cpu or on a GPU machine"
        )
    if cfg.pdl and torch.cuda.get_device_capability()[0] < 9:
        raise UserInputError(
            f"--pdl needs compute capability 9.0 or later (Hopper); this GPU "
            f"({torch.cuda.get_device_name()}) has {torch.cuda.get_device_capability()[0]}.x: "
            "build without --pdl"
        )
    compiler, compiler_record = compiler_options(cfg.bsymbolic)
    # Inductor's worker processes read $CXX when they start: name the compiler before anything
    # imports torch._inductor (see toolchain.use_compiler); on CUDA, give this process the ptxas
    # they give Triton, or max-autotune compiles every template twice (aotc/compiler/ptxas.py).
    with use_compiler(compiler["cpp.cxx"][1]), same_ptxas_as_workers(cfg.device == "cuda") as ptxas:
        if cfg.device == "cuda":
            compiler_record = {**compiler_record, "ptxas": ptxas or "triton's bundled ptxas"}
        return _build(cfg, progress, started, compiler, compiler_record)


def with_cpu_layout(manifest, quantization, device: str):
    """A CPU int4 package's tiles are in the layout of the CPU capability torch ran here
    (quantized_linear.int4_cpu_tiles): the manifest says which, and the runtimes refuse another."""
    import torch

    if device != "cpu" or quantization.scheme != "int4-weight-only" or not quantization.layers:
        return manifest
    capability = torch.backends.cpu.get_cpu_capability()
    return dataclasses.replace(
        manifest, device=dataclasses.replace(manifest.device, aten_cpu_capability=capability)
    )


def _build(
    cfg: BuildConfig, progress: Progress, started: float, compiler: dict, compiler_record: dict
) -> BuildResult:
    options = resolve_options(cfg)
    pdl_prefixes: tuple = ()  # the kernels launched with PDL: none without --pdl
    if cfg.pdl:  # Inductor's kernels wait and release too, unless an --option says otherwise
        options = {"triton.enable_pdl": True, **options}
        pdl_prefixes = launched_prefixes(options)
        compiler_record = {
            **compiler_record,
            "kernel_launch": "programmatic dependent launch for "
            + ", ".join(f"{prefix}*" for prefix in pdl_prefixes),
        }
    check_space(cfg.output, cfg.artifact)
    estimates = planned_stages(cfg, progress)
    with progress.stage(f"loading {cfg.artifact}", key="load"):
        ep, meta = load_artifact(cfg.artifact)
    generation = bool(meta.task) and meta.task.get("name") == "text-generation"
    if generation:
        options = generation_options(cfg.device, options)
    quantization = cfg.quantization()
    int4 = quantization is not None and quantization.scheme == "int4-weight-only"
    # a decode step's products with their neighbours in aotc's kernels (fused_products.py), where
    # the decode's rows reach them
    fused = generation and cfg.device == "cuda" and cfg.fused_products
    if fused:
        cuda_graphs = bool(preset_runtime(cfg.mode).get("cuda_graphs"))
        fused = fused_products_reach_decode(meta.task["batch_size"], cuda_graphs, int4, progress)
    fusions = Fusions() if fused else None
    nodes = len(ep.graph.nodes)  # what lowering, compiling and checking take time in proportion to
    progress.set_plan(
        {"load": progress.plan.get("load")}
        | {stage: estimates.seconds(stage, nodes) for stage in ("lower", "compile", "check")}
    )
    signature = meta.signature
    if quantization is not None and quantization.method == "gptq":
        quantization.calibration_chunks = calibration_for(cfg.artifact, meta)
    scheme = f", {quantization.scheme}" if quantization else ""
    with output_lock(cfg.output), staging_folder(cfg.output) as staging:
        with (
            progress.stage(
                f"lowering for {cfg.device} ({cfg.precision.value}{scheme})", key="lower"
            ),
            quiet_torch(),
        ):
            placed = place_program(
                ep, cfg.device, cfg.precision, signature, quantization, fusions=fusions
            )
            if fusions is not None and fusions.total():
                progress.note(fusions.describe())
            # a generation step's attention, as this device runs it best
            placed = lower_cached_attention(placed, implementation_for(cfg.device))
            # the fused products' tiles, timed on this GPU (aotc/kernels/product_tiles.py)
            tiles, tiles_record = (
                chosen_tiles(placed, progress)
                if fusions is not None and fusions.total()
                else ({}, {})
            )
        phases: dict = {}
        cxx = compiler["cpp.cxx"][1]
        # Inductor's vector-ISA probe runs in here: each of its answers once per machine, and
        # none for a CUDA package (its host code is a wrapper, not vector kernels)
        with remembered_vec_isa_probes(cxx, cfg.device) as probes:
            features = compiled_features(cfg.cpu_isa, cxx)
            # the package stores a bf16/fp16 build's state in that dtype, and says so
            packaged = dataclasses.replace(
                meta, signature=signature_in_precision(signature, cfg.precision)
            )
            manifest = new_manifest(cfg, packaged, options, compiler_record, features)
            if quantization:
                manifest = dataclasses.replace(manifest, quantization=quantization.record())
                manifest = with_cpu_layout(manifest, quantization, cfg.device)
            if fusions is not None and fusions.total():
                manifest = dataclasses.replace(manifest, fused_products=dataclasses.asdict(fusions))
            if tiles_record:
                manifest = dataclasses.replace(manifest, product_tiles=tiles_record)
            if not placed.state_dict and not placed.constants:
                # torch cannot open a 0-byte weights blob (mmap fails): a model without weights
                # keeps the default layout, its (empty) constants inside the .so
                options = {k: v for k, v in options.items() if k not in PACKAGING_OPTIONS}
                manifest = dataclasses.replace(manifest, inductor_options=options)
            # The compiled model carries what it was built as, so a runtime can tell an edited manifest
            # or a swapped model.pt2 from the real package (aotc_runtime's check_contract).
            described = {
                "aot_inductor.metadata": {
                    CONTRACT_KEY: json.dumps(model_contract(manifest), sort_keys=True)
                }
            }
            with (
                progress.stage(
                    f"compiling with AOTInductor, mode {cfg.mode.value}",
                    detail=TuningProgress(),
                    key="compile",
                ),
                inductor_phase_times(phases),
                programmatic_launches(pdl_prefixes),  # both compiles below
                tiles_in_force(tiles),
            ):
                compile_aoti(
                    placed,
                    staging / MODEL_FILE,
                    {**options, **compiler, **described},
                    cfg.precision,
                )
                if empty_weights_blob(staging / MODEL_FILE):
                    # weights that lowering folded away (known only now): compiled again as above
                    options = {k: v for k, v in options.items() if k not in PACKAGING_OPTIONS}
                    manifest = dataclasses.replace(manifest, inductor_options=options)
                    compile_aoti(
                        placed,
                        staging / MODEL_FILE,
                        {**options, **compiler, **described},
                        cfg.precision,
                    )
        phases[f"{STAGE_PREFIX}cpu_isa_probe"] = {
            "seconds": round(probes.seconds, 2),
            "calls": probes.runs,
        }
        normalize_archive(staging / MODEL_FILE)  # the same inputs give the same bytes
        write_tokenizer(cfg.artifact, manifest.generation, staging)
        if signature.get("state"):
            write_state(ep, signature, staging, cfg.precision)
        compile_seconds = time.perf_counter() - started
        manifest = dataclasses.replace(
            manifest, build_seconds=round(compile_seconds, 2), build_phases=phases
        )
        # the check's child loads the package through the runtime
        manifest = write_manifest(staging, manifest)
        atol, rtol = tolerance(
            cfg.precision.value, cfg.device, cfg.atol, cfg.rtol, cfg.quantize, meta.task, signature
        )
        with (
            progress.stage("checking the package against eager in a child process", key="check"),
            quiet_torch(),
        ):
            reference, checked = reference_program(
                ep, signature, cfg.device, cfg.precision, quantization
            )
            strict = cfg.device == "cuda" and cfg.precision == Precision.FP32
            check = check_numerics(
                reference,
                checked,
                staging,
                cfg.device,
                atol,
                rtol,
                cfg.allow_mismatch,
                strict=strict,
                task=meta.task,
                precision=cfg.precision.value,
                scale_relative=scale_relative(cfg.precision.value, cfg.quantize, cfg.device),
            )
        result = finish(staging, manifest, check, cfg.output, started, progress)
    estimates.record(progress.seconds)
    return result


def planned_stages(cfg: BuildConfig, progress: Progress) -> StageEstimates:
    """The build's four stages in the progress plan, the load's estimate known now (by the
    artifact's bytes), the others once the program is loaded (by its node count)."""
    artifact = Path(cfg.artifact)
    meta = peek_artifact_meta(artifact)
    task = meta.task if meta else None
    kind = build_kind(cfg.device, cfg.mode.value, cfg.precision.value, cfg.quantize, task)
    estimates = StageEstimates.for_this_machine(kind)
    load = estimates.seconds("load", artifact.stat().st_size if artifact.is_file() else 0)
    progress.set_plan({"load": load, "lower": None, "compile": None, "check": None})
    return estimates


def empty_weights_blob(package_path: Path) -> bool:
    """Whether AOTInductor wrote its weights blob with nothing in it."""
    with zipfile.ZipFile(package_path) as archive:
        return any(
            info.filename.endswith("_weights.blob") and info.file_size == 0
            for info in archive.infolist()
        )


_FAILED_NATIVE_WRITES: list = []


def compile_aoti(ep, package_path: Path, options: dict, precision: Precision) -> None:
    import torch

    try:
        with quiet_torch(), tf32_matmuls(precision == Precision.TF32):
            torch._inductor.aoti_compile_and_package(
                ep, package_path=str(package_path), inductor_configs=options
            )
    except (KeyboardInterrupt, BuildError):
        raise
    except Exception as exc:
        full = full_device(package_path.parent)
        if full:
            # torch's zip writer, still referenced by this traceback, throws again when destroyed
            # (std::terminate): keep it alive and let the CLI leave before it is collected.
            _FAILED_NATIVE_WRITES.append(exc)
            DiskFullError.leave_at_once = True
            raise DiskFullError(full) from None
        raise BuildError(
            f"AOTInductor could not compile the model: {type(exc).__name__}: {first_line(exc)[:300]}; "
            "rerun with --verbose for details"
        ) from exc


def chosen_tiles(placed, progress) -> tuple[dict, dict]:
    """(tiles in force while the package compiles, the manifest's product_tiles) for the fused
    products of `placed`, each weight shape and form's tile timed on this GPU (product_tiles.py)."""
    import torch

    from aotc.kernels import product_tiles, tile_timing
    from aotc.kernels.gemv import streaming_multiprocessors

    keys = product_tiles.fused_product_keys(placed.graph_module)
    if not keys:
        return {}, {}
    device = torch.device("cuda", torch.cuda.current_device())
    name = torch.cuda.get_device_name(device)
    programs = streaming_multiprocessors(device.index or 0)
    progress.note(f"timing the tiles of {len(keys)} fused product shape(s) on {name}")
    table, record = product_tiles.choose(
        keys,
        lambda key: tile_timing.rule_for(key, programs),
        lambda key, tile: tile_timing.seconds_on_gpu(key, tile, device),
    )
    return table, {"tuned_on": name, "tiles": record}


def fused_products_reach_decode(
    batch: int, cuda_graphs: bool, int4: bool, progress: Progress
) -> bool:
    """Whether a `--fused-products` build fuses, and what it says when the decode's rows pass the
    fused kernels' MAX_ROWS. Above them a fused product runs the unfused ops in a branch of their
    own (fused_products.fused_linear), where the norm before and the residual add after cannot
    fuse with their neighbours: on an H200 3.5% slower than `--pdl` alone at the 1B shape's batch
    8, 2.7% at GPT-2's 32, and for int4 a dequantization of every weight each step (2,727 against
    5,828 tokens/s for tinygemm's products at the 1B's batch 8) (docs/benchmarks.md).

    - A package that replays its decode as a CUDA graph feeds every row of its batch each step
      (aotc_runtime.cuda_graphs.DecodeGraph), so the kernels would never run at decode: the build
      leaves the fusion out and says so in one note (False).
    - Without the graph a step feeds only the rows in use, and up to MAX_ROWS of them run the
      kernels: a float build notes what more rows cost, an int4 build warns (True)."""
    from aotc.kernels.product_tiles import MAX_ROWS

    if batch <= MAX_ROWS:
        return True
    if cuda_graphs:
        progress.note(
            f"--fused-products left out: this package's decode replays a CUDA graph of all "
            f"{batch} rows, more than the {MAX_ROWS} aotc's fused kernels take (fused, such a "
            "step ran 3.5% slower than --pdl alone: 1B shape, batch 8, H200); export with "
            f"--batch-size {MAX_ROWS} or less to use them"
        )
        return False
    if int4:
        progress.warn(
            f"int4 products fused run aotc's int4 kernel up to {MAX_ROWS} rows; a decode of "
            f"more (up to {batch}) dequantizes every weight each step (1B shape, batch 8, H200: "
            f"2,727 against 5,828 tokens/s for tinygemm's); for a batch above {MAX_ROWS}, build "
            "int4 without --fused-products"
        )
    else:
        progress.note(
            f"fused products run aotc's kernels up to {MAX_ROWS} rows; a decode of more (up to "
            f"{batch}) runs the unfused products, about 3% slower than a build with --pdl alone "
            "(1B shape, batch 8, H200)"
        )
    return True
