"""`aotc export`: user model -> ExportedProgram saved with torch.export.save (+ aotc's signature).

Steps: load the model, make the example call, run it eagerly once (a model that fails by itself is
reported as such, at the user's line; its buffers are restored after, so the artifact holds the
model's initial state), export the flat wrapper of aotc/export/call_structure.py with torch.export Dims,
lift the buffers forward mutates out as state, save atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aotc.config import ExportConfig
from aotc.errors import ExportError, ModelError, UserInputError
from aotc.export.artifact import ArtifactMeta, save_artifact
from aotc.export.call_structure import (
    TENSOR,
    OutputLayout,
    call_model,
    make_flat_call,
    output_layout,
)
from aotc.export.dim_ranges import check_dim_ranges
from aotc.export.example_call import ExampleCall, describe, example_call
from aotc.export.loading import LoadedModel, load_model
from aotc.export.problems import diagnose
from aotc.export.shapes import export_dynamic_shapes
from aotc.export.signature import make_signature
from aotc.export.user_frames import first_line, innermost_user_frame
from aotc.export.weights import load_weights
from aotc.progress import Progress
from aotc.quiet import quiet_torch
from aotc.stage_estimates import StageEstimates, export_kind

# FlatCall holds the user's module as `model`: its buffer FQNs start with this
STATE_PREFIX = "model."


@dataclass
class ExportResult:
    output: Path
    model: str
    signature: dict
    seconds: float
    notes: tuple = ()  # what the user should know of the export, one line each

    def to_dict(self) -> dict:
        return {
            "artifact": str(self.output),
            "model": self.model,
            "signature": self.signature,
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
        }


def export_model(cfg: ExportConfig, progress: Progress | None = None) -> ExportResult:
    cfg.validate()
    progress = progress or Progress(enabled=False)
    started = time.perf_counter()
    import torch

    estimates = planned_stages(cfg, progress)
    cfg, folder_notes = with_folder_tokenizer(cfg)
    extras = tokenizer_extras(cfg)
    with progress.stage(f"loading {cfg.model}", key="load"):
        loaded, call, task = prepare_model(cfg, extras)
    modules = sum(1 for _ in loaded.module.modules())  # what running and tracing take time with
    state_bytes = sum(t.numel() * t.element_size() for t in loaded.module.state_dict().values())
    progress.set_plan(
        {"load": progress.plan.get("load")}
        | {stage: estimates.seconds(stage, modules) for stage in ("eager", "trace")}
        | {"save": estimates.seconds("save", state_bytes)}
    )
    with progress.stage("running the model once eagerly", key="eager"), torch.no_grad():
        written: list = []
        layout = output_layout(check_eager(loaded, call, written))
    with progress.stage("tracing with torch.export", key="trace"):
        ep, state = export_with_state(loaded, call, layout, cfg.strict, written)
        if foreign := foreign_ops(ep):
            raise ExportError(
                f"{loaded.description} exports to {', '.join(foreign)}, an op defined outside "
                "PyTorch that `aotc build` and the runtimes cannot load; write that part with "
                "torch operations (or a model option that avoids the op)"
            )
        signature = make_signature(ep, call, layout, state)
        if call.dims and task is None:  # a generation step's S is checked by its build's loop
            check_dim_ranges(ep, signature, call)
    meta = dataclasses.replace(
        ArtifactMeta.new(model=loaded.description, signature=signature), task=task
    )
    with progress.stage(f"saving {cfg.output}", key="save"):
        if cfg.format == "onnx":
            from aotc.export.onnx import export_to_onnx

            export_to_onnx(ep, meta, cfg.output)
        else:
            save_artifact(ep, meta, cfg.output, carried_files(cfg, extras))
    estimates.record(progress.seconds)
    from aotc.export.text_generation import task_notes

    notes = folder_notes + loaded.notes + extras.notes + task_notes(task)
    seconds = time.perf_counter() - started
    progress.note(f"wrote {cfg.output} in {seconds:.1f}s ({progress.breakdown()})")
    return ExportResult(cfg.output, loaded.description, signature, seconds, notes)


def planned_stages(cfg: ExportConfig, progress: Progress) -> StageEstimates:
    """The export's four stages in the progress plan, the load's estimate known now (by the bytes
    of the weights it reads), the others once the model is built (by its size)."""
    from aotc.export.model_folder import is_model_folder

    folder = is_model_folder(cfg.model)
    estimates = StageEstimates.for_this_machine(export_kind(folder, cfg.task))
    load = estimates.seconds("load", weight_bytes(Path(cfg.model) if folder else None, cfg.weights))
    progress.set_plan({"load": load, "eager": None, "trace": None, "save": None})
    return estimates


def weight_bytes(folder: Path | None, weights: Path | str | None) -> int:
    """The bytes of the weight files an export reads (a folder's safetensors, or --weights)."""
    files = list(folder.glob("*.safetensors")) if folder else []
    if weights:
        files.append(Path(weights))
    return sum(f.stat().st_size for f in files if f.is_file())


def with_folder_tokenizer(cfg: ExportConfig) -> tuple[ExportConfig, tuple]:
    """A model folder exported with --task carries its own tokenizer (and chat template) unless
    --tokenizer names another: (the config, notes for the user)."""
    from aotc.export.model_folder import is_model_folder

    if cfg.task is None or cfg.tokenizer is not None or not is_model_folder(cfg.model):
        return cfg, ()
    folder = Path(cfg.model)
    if os.path.lexists(
        folder / "tokenizer.json"
    ):  # read as a folder file: a link or FIFO is refused
        return dataclasses.replace(cfg, tokenizer=folder), ()
    return cfg, (
        f"{folder} has no tokenizer.json (a fast tokenizer), so the package carries no tokenizer "
        "and takes token ids only; save one there (tokenizer.save_pretrained) or pass --tokenizer DIR",
    )


def tokenizer_extras(cfg: ExportConfig):
    """The chat template and special tokens of the tokenizer folder a generation export carries."""
    from aotc.export.tokenizer_folder import TokenizerExtras, read_tokenizer_extras

    if cfg.task is None or cfg.tokenizer is None:
        return TokenizerExtras()
    return read_tokenizer_extras(cfg.tokenizer)


def carried_files(cfg: ExportConfig, extras=None) -> dict:
    """Files the artifact carries besides the program: a text-generation model's tokenizer and
    chat template."""
    if cfg.tokenizer is None:
        return {}
    from aotc.export.artifact import CHAT_TEMPLATE_ENTRY, TOKENIZER_ENTRY
    from aotc.export.text_generation import read_tokenizer

    files = {TOKENIZER_ENTRY: read_tokenizer(cfg.tokenizer)}
    if extras is not None and extras.chat_template is not None:
        files[CHAT_TEMPLATE_ENTRY] = extras.chat_template
    return files


def prepare_model(cfg: ExportConfig, extras=None) -> tuple[LoadedModel, ExampleCall, dict | None]:
    """(loaded model with its weights, the example call to trace, the --task record or None).
    `extras`: the chat template and special tokens the generation record names."""
    from aotc.export.model_folder import is_model_folder

    if cfg.weights and is_model_folder(cfg.model):
        raise UserInputError(
            f"--weights goes with a model file; {cfg.model} is a model folder, whose weights are "
            "its safetensors files: leave --weights out"
        )
    # with --task the inputs are the task's, so --dtype is the model's (config.py)
    loaded = load_model(cfg.model, cfg.entry, cfg.dtypes[0] if cfg.task and cfg.dtypes else None)
    if cfg.weights:
        load_weights(loaded.module, cfg.weights)
    portable_experts(loaded.module)
    if cfg.task is None:
        loaded = dataclasses.replace(loaded, notes=loaded.notes + cache_output_off(loaded.module))
        return loaded, example_call(cfg, loaded), None
    from aotc.export.text_generation import generation_export

    loaded, dims, task = generation_export(loaded, cfg, extras)
    return loaded, example_call(dataclasses.replace(cfg, dims=dims), loaded), task


def cache_output_off(module) -> tuple:
    """A transformers LM exported as one call returns its KV cache (past_key_values, a Cache
    object) unless its config says use_cache=False, and a package returns tensors only: turn the
    cache off, as one call never reads it back. Returns the note that says so."""
    config = getattr(module, "config", None)
    can_generate = getattr(module, "can_generate", None)
    if not getattr(config, "use_cache", False) or not callable(can_generate) or not can_generate():
        return ()
    config.use_cache = False
    name = type(module).__name__
    generation = (
        "; for generation over a KV cache export it with --task text-generation --max-seq-len N"
        if getattr(type(module), "_can_compile_fullgraph", False)
        else ""
    )
    return (
        f"{name} is exported without its KV cache output (config.use_cache = False){generation}",
    )


# The experts implementation of transformers' mixture-of-experts models that exports to aten ops
# only: "grouped_mm" (their default) calls transformers' own Python-defined op
# (torch.ops.transformers.grouped_mm_fallback), which no build or runtime process has, and
# "eager" indexes by routing values (data-dependent shapes). transformers' ExecuTorch exporter
# makes the same choice (transformers/exporters/exporter_executorch.py).
PORTABLE_EXPERTS = "batched_mm"


def portable_experts(module) -> None:
    """Switch a transformers mixture-of-experts model to experts that export to aten ops."""
    can_set = getattr(type(module), "_can_set_experts_implementation", None)
    if can_set is None or not can_set():
        return
    config = getattr(module, "config", None)
    if getattr(config, "_experts_implementation", None) != PORTABLE_EXPERTS:
        module.set_experts_implementation(PORTABLE_EXPERTS)


def foreign_ops(ep) -> list[str]:
    """The ops the program calls that are neither PyTorch's own (aten, prims), aotc's (which every
    build lowers to kernels: cached_attention.py), nor higher-order control flow: ops defined by a
    library or the model's code, which `aotc build` and the runtimes cannot load (they import
    neither)."""
    import torch

    found = set()
    for node in ep.graph_module.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if target.namespace not in ("aten", "prims", "aotc"):
            found.add(f"torch.ops.{target.namespace}.{target._schema.name.split('::')[-1]}")
    return sorted(found)


@contextlib.contextmanager
def buffers_restored(module):
    """Put every buffer back as it was on leaving: a forward that updates a counter or a cache must
    not leave the artifact one call ahead of the model as constructed."""
    import torch

    saved = {name: buf.detach().clone() for name, buf in module.named_buffers()}
    try:
        yield saved
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                owner_name, _, leaf = name.rpartition(".")
                owner = module.get_submodule(owner_name)
                current = owner._buffers.get(leaf)
                if (
                    current is not None
                    and current.shape == value.shape
                    and current.dtype == value.dtype
                ):
                    # in place: other references to the buffer see the restore too
                    current.copy_(value)
                else:
                    # forward rebound it with another shape (a growing cache)
                    owner._buffers[leaf] = value


def check_eager(loaded: LoadedModel, call: ExampleCall, written: list | None = None):
    """Run the model once as plain PyTorch (state restored after) and return its output;
    `written`, when given, receives what buffer_writes saw of that run.

    If it fails here, the model is wrong, not the export.
    """
    try:
        with buffers_restored(loaded.module) as saved, buffer_writes(loaded.module, saved) as seen:
            output = call_model(
                loaded.module, call.tensors, call.n_positional, call.keywords, call.constants
            )
        if written is not None:
            written.extend(seen)
        return output
    except Exception as exc:
        where = innermost_user_frame(exc, loaded.source_files)
        at = f" at {where}" if where else ""
        raise ModelError(
            f"the model itself fails on inputs ({describe(call)}){at}: {type(exc).__name__}: {first_line(exc)}; "
            "fix the model or the --input-shape"
        ) from exc


def flat_module(loaded: LoadedModel, call: ExampleCall, layout: OutputLayout, state: tuple = ()):
    return make_flat_call(
        loaded.module,
        call.n_positional,
        call.keywords,
        call.constants,
        layout.structure == TENSOR,
        state,
    )


def export_with_state(
    loaded: LoadedModel,
    call: ExampleCall,
    layout: OutputLayout,
    strict: bool,
    written: list | None = None,
):
    """(ExportedProgram, [(name, initial value)] of the state lifted out of it).

    The buffers forward mutates are exported as extra inputs that the program updates in place
    (aotc/export/call_structure.py). `written`: those buffers as the eager run saw them write
    (buffer_writes); then the model is exported once. Without it (or where the eager run could
    not tell: [None]), a first export shows them once functionalized, and if there are any the
    model is exported again with them lifted (for the zoo's Qwen2 generation step, that first
    export and its functionalization took 1.9 of the 2.4 s of the three).
    """
    if written is None or None in written:
        ep = export_program(
            loaded, flat_module(loaded, call, layout), call.tensors, call.shapes, call.dims, strict
        )
        mutated = mutated_buffers(ep)
        if not mutated:
            return ep, []
        names = tuple(name[len(STATE_PREFIX) :] for name in mutated)
    elif not written:
        return export_program(
            loaded, flat_module(loaded, call, layout), call.tensors, call.shapes, call.dims, strict
        ), []
    else:
        names = tuple(written)
    initial = [loaded.module.get_buffer(name).detach().clone() for name in names]
    ep = export_program(
        loaded,
        flat_module(loaded, call, layout, names),
        call.tensors + initial,
        call.shapes,
        call.dims,
        strict,
        extra_static=len(initial),
    )
    return ep, list(zip(names, initial))


@contextlib.contextmanager
def buffer_writes(module, saved: dict | None = None) -> Iterator[list]:
    """Yields a list that holds, on leaving, the names of the buffers of `module` that the code
    inside wrote, sorted as mutated_buffers sorts them: written in place (the buffer's version
    counter moved; a write through a view of it moves it too) or rebound to another tensor. It
    holds [None] instead where it cannot tell: a buffer that keeps no version counter (one made
    in inference mode), or, given `saved` (each buffer's value before, buffers_restored's), one
    whose value changed while its counter did not (a write through `.data`)."""
    import torch

    before = dict(module.named_buffers())
    try:
        versions = {name: buf._version for name, buf in before.items()}
    except RuntimeError:  # "Inference tensors do not track version counter"
        versions = None
    written: list = []
    try:
        yield written
    finally:
        if versions is None:
            written.append(None)
        else:
            after = dict(module.named_buffers())
            seen = sorted(
                name
                for name, buf in before.items()
                if after.get(name) is not buf or buf._version != versions[name]
            )
            hidden = saved is not None and any(
                not torch.equal(buf, saved[name])
                for name, buf in before.items()
                if name not in seen and name in saved
            )
            written.extend([None] if hidden else seen)


def mutated_buffers(ep) -> list:
    """FQNs of the buffers the program writes. torch.export's graph keeps in-place ops (`add_` on
    the buffer) and records mutations only once functionalized, so ask a functionalized copy (no
    decompositions: an empty table, well under a second for small models)."""
    with quiet_torch():
        functional = ep.run_decompositions({})
    return sorted(set(functional.graph_signature.buffers_to_mutate.values()))


def export_program(
    loaded: LoadedModel, module, inputs, shapes, dims, strict: bool, extra_static: int = 0
):
    import torch

    try:
        with quiet_torch(), buffers_restored(loaded.module):
            return torch.export.export(
                module,
                tuple(inputs),
                dynamic_shapes=export_dynamic_shapes(shapes, dims, extra_static),
                strict=strict,
            )
    except Exception as exc:
        problem = diagnose(exc, loaded.source_files, dims, shapes)
        raise ExportError(
            f"torch.export cannot capture {loaded.description}: {problem.one_line()}; "
            f"`aotc explain` with the same arguments lists every problem"
        ) from exc
