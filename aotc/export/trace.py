"""`aotc export`: user model -> ExportedProgram saved with torch.export.save (+ aotc's signature).

Steps: load the model, make the example call, run it eagerly once (a model that fails by itself is
reported as such, at the user's line; its buffers are restored after, so the artifact holds the
model's initial state), export the flat wrapper of aotc/export/call_structure.py with torch.export Dims,
lift the buffers forward mutates out as state, save atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
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
from aotc.quiet import quiet_torch

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


def export_model(cfg: ExportConfig) -> ExportResult:
    cfg.validate()
    started = time.perf_counter()
    import torch

    loaded, call, task = prepare_model(cfg)
    with torch.no_grad():
        layout = output_layout(check_eager(loaded, call))
    ep, state = export_with_state(loaded, call, layout, cfg.strict)
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
    if cfg.format == "onnx":
        from aotc.export.onnx import export_to_onnx

        export_to_onnx(ep, meta, cfg.output)
    else:
        save_artifact(ep, meta, cfg.output, carried_files(cfg))
    from aotc.export.text_generation import task_notes

    return ExportResult(
        cfg.output, loaded.description, signature, time.perf_counter() - started, task_notes(task)
    )


def carried_files(cfg: ExportConfig) -> dict:
    """Files the artifact carries besides the program: a text-generation model's tokenizer."""
    if cfg.tokenizer is None:
        return {}
    from aotc.export.artifact import TOKENIZER_ENTRY
    from aotc.export.text_generation import read_tokenizer

    return {TOKENIZER_ENTRY: read_tokenizer(cfg.tokenizer)}


def prepare_model(cfg: ExportConfig) -> tuple[LoadedModel, ExampleCall, dict | None]:
    """(loaded model with its weights, the example call to trace, the --task record or None)."""
    loaded = load_model(cfg.model, cfg.entry)
    if cfg.weights:
        load_weights(loaded.module, cfg.weights)
    portable_experts(loaded.module)
    if cfg.task is None:
        return loaded, example_call(cfg, loaded), None
    from aotc.export.text_generation import generation_export

    loaded, dims, task = generation_export(loaded, cfg)
    return loaded, example_call(dataclasses.replace(cfg, dims=dims), loaded), task


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


def load_weights(module, path: Path) -> None:
    import torch

    try:
        if path.suffix == ".safetensors":
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise UserInputError(
                    "--weights is a .safetensors file but safetensors is not installed; pip install safetensors"
                ) from None
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except UserInputError:
        raise
    except Exception as exc:
        raise UserInputError(
            f"--weights {path} could not be read as a state_dict: {first_line(exc)}"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise UserInputError(
            f"--weights {path} does not fit the model: {' '.join(str(exc).split())[:400]}"
        ) from None


@contextlib.contextmanager
def buffers_restored(module):
    """Put every buffer back as it was on leaving: a forward that updates a counter or a cache must
    not leave the artifact one call ahead of the model as constructed."""
    import torch

    saved = {name: buf.detach().clone() for name, buf in module.named_buffers()}
    try:
        yield
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


def check_eager(loaded: LoadedModel, call: ExampleCall):
    """Run the model once as plain PyTorch (state restored after) and return its output.

    If it fails here, the model is wrong, not the export.
    """
    try:
        with buffers_restored(loaded.module):
            return call_model(
                loaded.module, call.tensors, call.n_positional, call.keywords, call.constants
            )
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


def export_with_state(loaded: LoadedModel, call: ExampleCall, layout: OutputLayout, strict: bool):
    """(ExportedProgram, [(name, initial value)] of the state lifted out of it).

    A first export shows which buffers forward mutates; if any, the model is exported again with
    those buffers as extra inputs that the program updates in place (aotc/export/call_structure.py).
    """
    ep = export_program(
        loaded, flat_module(loaded, call, layout), call.tensors, call.shapes, call.dims, strict
    )
    mutated = mutated_buffers(ep)
    if not mutated:
        return ep, []
    names = tuple(name[len(STATE_PREFIX) :] for name in mutated)
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
