"""`aotc export`: user model -> ExportedProgram saved with torch.export.save (+ aotc's signature).

Steps: load the model, make example inputs, run it eagerly once (a model that fails by itself is
reported as such, at the user's line), export with torch.export Dims, save atomically.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .config import ExportConfig
from .errors import ExportError, ModelError, UserInputError
from .export_problems import diagnose
from .loading import LoadedModel, load_model
from .quiet import quiet_torch
from .shapes import format_shape, resolve_dims
from .user_frames import first_line, innermost_user_frame

ARTIFACT_META = "aotc.json"
ARTIFACT_KIND = "aotc-export"


@dataclass
class ExportResult:
    output: Path
    model: str
    signature: dict
    seconds: float

    def to_dict(self) -> dict:
        return {"artifact": str(self.output), "model": self.model, "signature": self.signature, "seconds": round(self.seconds, 3)}


def export_model(cfg: ExportConfig) -> ExportResult:
    cfg.validate()
    started = time.perf_counter()
    import torch

    loaded, inputs, shapes, dims = prepare_model(cfg)
    with torch.no_grad():
        check_eager(loaded, inputs)
    ep = export_program(loaded, inputs, shapes, dims, cfg.strict)
    signature = make_signature(ep, inputs, shapes, dims)
    meta = {
        "kind": ARTIFACT_KIND,
        "aotc_version": __version__,
        "torch": torch.__version__,
        "model": loaded.description,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "signature": signature,
    }
    save_artifact(ep, meta, cfg.output)
    return ExportResult(cfg.output, loaded.description, signature, time.perf_counter() - started)


def prepare_model(cfg: ExportConfig):
    """(loaded model with its weights, example inputs, shapes with dim names, {name: DimSpec})."""
    loaded = load_model(cfg.model, cfg.entry)
    if cfg.weights:
        load_weights(loaded.module, cfg.weights)
    inputs, shapes, dims = example_inputs(cfg, loaded)
    return loaded, inputs, shapes, dims


def load_weights(module, path: Path) -> None:
    import torch

    try:
        if path.suffix == ".safetensors":
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise UserInputError("--weights is a .safetensors file but safetensors is not installed; pip install safetensors") from None
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except UserInputError:
        raise
    except Exception as exc:
        raise UserInputError(f"--weights {path} could not be read as a state_dict: {first_line(exc)}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise UserInputError(f"--weights {path} does not fit the model: {' '.join(str(exc).split())[:400]}") from None


def example_inputs(cfg: ExportConfig, loaded: LoadedModel):
    """(tensors, shapes with dim names, {name: DimSpec}) from --input-shape or the file's example_inputs()."""
    import torch
    from aotc_runtime.signature import random_tensor

    if cfg.input_shapes:
        dims = resolve_dims(cfg.input_shapes, cfg.dims)
        sizes = {name: dim.example_size() for name, dim in dims.items()}
        generator = torch.Generator().manual_seed(0)
        tensors = []
        for index, shape in enumerate(cfg.input_shapes):
            concrete = [entry if isinstance(entry, int) else sizes[entry] for entry in shape]
            tensors.append(random_tensor(concrete, cfg.dtype_for(index), None, generator))
        return tensors, list(cfg.input_shapes), dims
    if cfg.dims:
        raise UserInputError("--dim needs --input-shape to say which axes it names")
    if loaded.example_inputs is None:
        raise UserInputError(f"{loaded.description}: no inputs given; pass --input-shape (one per input) or define example_inputs() in the model file")
    try:
        produced = loaded.example_inputs()
    except Exception as exc:
        where = innermost_user_frame(exc, loaded.source_files)
        raise ModelError(f"example_inputs() failed at {where}: {type(exc).__name__}: {first_line(exc)}") from exc
    tensors = [produced] if isinstance(produced, torch.Tensor) else list(produced)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ModelError("example_inputs() must return a tensor or a tuple of tensors")
    return tensors, [tuple(t.shape) for t in tensors], {}


def describe_inputs(inputs) -> str:
    return ", ".join(f"{format_shape(tuple(t.shape))} {str(t.dtype).replace('torch.', '')}" for t in inputs)


def check_eager(loaded: LoadedModel, inputs) -> None:
    """Run the model once as plain PyTorch: if it fails here, the model is wrong, not the export."""
    try:
        loaded.module(*inputs)
    except Exception as exc:
        where = innermost_user_frame(exc, loaded.source_files)
        at = f" at {where}" if where else ""
        raise ModelError(
            f"the model itself fails on inputs ({describe_inputs(inputs)}){at}: {type(exc).__name__}: {first_line(exc)}; "
            "fix the model or the --input-shape"
        ) from exc


def export_program(loaded: LoadedModel, inputs, shapes, dims, strict: bool):
    import torch

    export_dims = {name: torch.export.Dim(name, min=d.min, max=d.max) for name, d in dims.items()}
    dynamic = None
    if export_dims:
        dynamic = tuple({axis: export_dims[e] for axis, e in enumerate(shape) if isinstance(e, str)} or None for shape in shapes)
    try:
        with quiet_torch():
            return torch.export.export(loaded.module, tuple(inputs), dynamic_shapes=dynamic, strict=strict)
    except Exception as exc:
        problem = diagnose(exc, loaded.source_files, dims, shapes)
        raise ExportError(
            f"torch.export cannot capture {loaded.description}: {problem.one_line()}; "
            f"`aotc explain` with the same arguments lists every problem"
        ) from exc


def _symbol_names(ep, shapes) -> dict:
    """sympy symbol of each dynamic input axis -> the user's dim name."""
    names = {}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
    for node, shape in zip(placeholders, shapes):
        value = node.meta.get("val")
        for axis, entry in enumerate(shape):
            if isinstance(entry, str) and value is not None and hasattr(value.shape[axis], "node"):
                names[str(value.shape[axis].node.expr)] = entry
    return names


def _dim_text(size, names: dict):
    if isinstance(size, int):
        return size
    text = str(size.node.expr) if hasattr(size, "node") else str(size)
    for symbol, name in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(symbol, name)
    return text


def make_signature(ep, inputs, shapes, dims) -> dict:
    import torch
    from aotc_runtime.signature import DTYPE_NAMES

    names = _symbol_names(ep, shapes)
    spec_inputs = []
    for name, tensor, shape in zip(ep.graph_signature.user_inputs, inputs, shapes):
        value_range = None
        if not tensor.dtype.is_floating_point and tensor.dtype != torch.bool and tensor.numel():
            value_range = [int(tensor.min()), int(tensor.max())]
        spec_inputs.append({"name": name, "dtype": DTYPE_NAMES[tensor.dtype], "shape": list(shape), "value_range": value_range})
    output_node = next(n for n in ep.graph.nodes if n.op == "output")
    outputs = []
    for index, node in enumerate(output_node.args[0]):
        value = node.meta.get("val") if hasattr(node, "meta") else None
        if value is None or not hasattr(value, "shape"):
            continue
        outputs.append({
            "name": f"output_{index}",
            "dtype": DTYPE_NAMES.get(value.dtype, str(value.dtype)),
            "shape": [_dim_text(s, names) for s in value.shape],
        })
    return {"inputs": spec_inputs, "outputs": outputs, "dims": {n: d.to_dict() for n, d in dims.items()}}


def save_artifact(ep, meta: dict, output: Path) -> None:
    """torch.export.save to a temporary name beside the target, then rename (never half-written)."""
    import torch

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.stem}.{os.getpid()}.tmp.pt2")  # torch.export.save wants a .pt2 name
    try:
        with quiet_torch():
            torch.export.save(ep, str(tmp), extra_files={ARTIFACT_META: json.dumps(meta)})
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)


def load_artifact(path: Path):
    """(ExportedProgram, meta) or a UserInputError that says this is not an aotc export artifact."""
    import torch

    extra = {ARTIFACT_META: ""}
    try:
        with quiet_torch():
            ep = torch.export.load(str(path), extra_files=extra)
    except Exception as exc:
        raise UserInputError(
            f"{path} is not a torch.export artifact ({type(exc).__name__}: {first_line(exc)[:120]}); "
            f"create one with `aotc export MODEL -o {path.name}`"
        ) from None
    try:
        meta = json.loads(extra[ARTIFACT_META])
    except (json.JSONDecodeError, TypeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("kind") != ARTIFACT_KIND:
        raise UserInputError(f"{path} is an ExportedProgram but not one written by `aotc export` (no signature); re-export it with `aotc export`")
    return ep, meta
