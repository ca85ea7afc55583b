"""An exported program -> an ONNX model: torch.onnx's dynamo exporter (onnxscript), inputs and
outputs named as aotc's signature names them, dynamic dims named as the signature's dims, the
signature stored in the model's metadata_props, onnx.checker's full check, and the model checked
against the program run eagerly (the figures stored beside the signature).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from aotc.errors import ExportError, UserInputError
from aotc.export.artifact import ArtifactMeta

SIGNATURE_KEY = "aotc.signature"  # metadata_props: the signature JSON (aotc_runtime.Signature)
MODEL_KEY = "aotc.model"  # what was exported
CHECK_KEY = "aotc.export_check"  # the model against eager at export: worst max abs per output
ONNX_PIN = "onnx==1.23.2 onnxscript==0.7.2 onnxruntime==1.31.1"


@dataclass
class OnnxModelInfo:
    signature: dict
    model: str | None
    export_check: dict


def require_onnx() -> None:
    """The extra is installed, or a one-line error (exit 2) with the install line."""
    missing = []
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        from aotc_runtime import MissingDependencyError

        raise MissingDependencyError(
            f"ONNX export and the onnxruntime backend need {', '.join(missing)}, not installed; "
            f"pip install 'aotc[onnx]' (pinned: {ONNX_PIN})"
        )


def flat_names(signature: dict) -> tuple[list[str], list[str]]:
    """ONNX input and output names: the signature's inputs then state, outputs then new state."""
    state = [s["name"] for s in signature.get("state", ())]
    inputs = [s["name"] for s in signature["inputs"]] + state
    outputs = [s["name"] for s in signature["outputs"]] + [f"{name}__new" for name in state]
    return inputs, outputs


def export_to_onnx(ep, meta: ArtifactMeta, output: Path) -> OnnxModelInfo:
    """Write `output` (.onnx) from the exported program; refuse what the exporter cannot handle."""
    require_onnx()
    import onnx
    import torch

    from aotc.quiet import quiet_torch

    try:
        # inside the try: re-exporting a stateful program can fail as the ONNX export can
        ep, signature = state_returned(ep, meta.signature)
        inputs, outputs = flat_names(signature)
        with quiet_torch(), torch.no_grad():
            program = torch.onnx.export(
                ep,
                args=tuple(ep.example_inputs[0]),
                dynamo=True,
                input_names=inputs,
                output_names=outputs,
                verbose=False,
            )
    except Exception as exc:
        raise ExportError(unsupported_message(exc, ep)) from None
    model = program.model_proto
    name_dims(model, signature)
    set_metadata(model, {SIGNATURE_KEY: json.dumps(signature), MODEL_KEY: meta.model or ""})
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        raise ExportError(
            f"the ONNX model torch.onnx produced fails onnx.checker: {_first(exc)}; "
            f"{instead(signature)}"
        ) from None
    check = check_against_eager(model, ep, signature, meta.task)
    set_metadata(model, {CHECK_KEY: json.dumps(check)})
    from aotc_runtime import replaced_atomically

    with replaced_atomically(output) as tmp:
        onnx.save_model(model, str(tmp))
    return OnnxModelInfo(signature, meta.model, check)


def state_returned(ep, signature: dict) -> tuple:
    """(program, signature) for ONNX, which cannot update an input in place: a program that writes
    its state into its state inputs (signature.state_in_place) exported again to return the new
    state after its outputs instead, the convention of ONNX packages (flat_names)."""
    if not signature.get("state_in_place"):
        return ep, signature
    import torch

    from aotc.export.shapes import signature_dynamic_shapes
    from aotc.quiet import quiet_torch
    from aotc_runtime import flatten_outputs

    module, n_inputs = ep.module(), len(signature["inputs"])

    class StateReturned(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = module

        def forward(self, *flat):
            state = [t.clone() for t in flat[n_inputs:]]
            outputs = flatten_outputs(self.module(*flat[:n_inputs], *state))
            return (*outputs, *state)

    with quiet_torch():
        returned = torch.export.export(
            StateReturned(),
            tuple(ep.example_inputs[0]),
            dynamic_shapes=signature_dynamic_shapes(signature),
            strict=False,
        )
    return returned, {k: v for k, v in signature.items() if k != "state_in_place"}


def unsupported_message(exc: BaseException, ep=None) -> str:
    """One line: the operator or construct the exporter stopped at, where the model calls it, and
    what to do."""
    text = " ".join(str(exc).split())
    operator = re.search(r"(aten::[\w.]+|aten\.[\w.]+|torch\.ops\.[\w.]+)", text)
    where = _call_site(ep, operator.group(1)) if operator and ep is not None else None
    at = f" (at {where})" if where else ""
    if operator:
        return (
            f"the ONNX exporter cannot convert {operator.group(1)}{at}: no ONNX translation for it; "
            "build this model with AOTInductor (aotc build without --backend onnxruntime), or "
            "rewrite that operation with ones ONNX has"
        )
    return (
        f"the ONNX exporter failed: {type(exc).__name__}: {text[:240]}; build this model with "
        "AOTInductor (aotc build without --backend onnxruntime)"
    )


def _call_site(ep, operator: str) -> str | None:
    """The user's file:line of the graph node that calls `operator` (from its stack trace)."""
    from aotc.export.user_frames import is_user_file, location

    wanted = operator.replace("::", ".").split(".")
    name = wanted[1] if len(wanted) > 1 and wanted[0] in ("aten", "torch") else wanted[-1]
    if name == "ops" and len(wanted) > 3:
        name = wanted[3]
    for node in ep.graph.nodes:
        if node.op != "call_function" or name.lstrip("_") not in str(node.target):
            continue
        frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
        user = [(file, int(line)) for file, line in frames if is_user_file(file)]
        if user:
            return str(location(*user[-1]))
    return None


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:240]


def name_dims(model, signature: dict) -> None:
    """Dynamic dims of graph inputs named as the signature names them (B, S) instead of s39."""
    specs = list(signature["inputs"]) + list(signature.get("state", ()))
    for value, spec in zip(model.graph.input, specs):
        for dim, size in zip(value.type.tensor_type.shape.dim, spec["shape"]):
            if isinstance(size, str):
                dim.dim_param = size


def set_metadata(model, entries: dict) -> None:
    for key, value in entries.items():
        for prop in model.metadata_props:
            if prop.key == key:
                prop.value = value
                break
        else:
            prop = model.metadata_props.add()
            prop.key, prop.value = key, value


def metadata(model) -> dict:
    return {prop.key: prop.value for prop in model.metadata_props}


def instead(signature: dict) -> str:
    """What works when ONNX Runtime cannot take the model: AOTInductor, from the same artifact;
    or, for a half-precision model (ONNX Runtime's CPU kernels lack most bfloat16 ones), the
    model exported in float32."""
    dtypes = {
        spec["dtype"] for spec in (*signature.get("outputs", ()), *signature.get("state", ()))
    }
    half = (
        "; or re-export the model in float32 (a --task export: --dtype float32) for ONNX Runtime"
        if dtypes & {"bfloat16", "float16"}
        else ""
    )
    return (
        "build with AOTInductor instead (`aotc build ARTIFACT.pt2` without --backend onnxruntime; "
        f"`aotc export` without --format onnx){half}"
    )


def check_against_eager(model, ep, signature: dict, task: dict | None = None) -> dict:
    """The ONNX model (ONNX Runtime, no graph optimization) against the program run eagerly, on the
    build check's cases (a generation step's: the calls of a generation); {output name: max abs
    difference}."""
    from aotc.export.eager_reference import eager_outputs, input_cases

    cases = input_cases(ep, signature, "cpu", task=task)
    references = eager_outputs(ep, cases, signature, calls=1)
    state = _initial_state(ep, signature)
    names = [o.name for o in model.graph.output]
    worst: dict = {}
    for got, reference in zip(unoptimized_outputs(model, cases, state, signature), references):
        for name, array, want in zip(names, got, reference):
            diff = float((array.double() - want.double()).abs().max())
            worst[name] = max(worst.get(name, 0.0), diff)
    return worst


def unoptimized_outputs(
    model, cases: list, state: list = (), signature: dict | None = None
) -> list:
    """The ONNX model run by ONNX Runtime with no graph optimization on each (label, tensors) case
    (the initial state after the inputs): one list of output tensors per case."""
    import onnxruntime as ort
    import torch

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime's own exception types
        raise ExportError(
            f"ONNX Runtime cannot load the ONNX model torch.onnx produced: {_first(exc)}; "
            f"{instead(signature or {})}"
        ) from None
    names = [i.name for i in session.get_inputs()]
    results = []
    for label, tensors in cases:
        feeds = dict(zip(names, [t.numpy() for t in [*tensors, *state]]))
        try:
            results.append([torch.from_numpy(a) for a in session.run(None, feeds)])
        except Exception as exc:  # onnxruntime's own exception types
            raise ExportError(
                f"ONNX Runtime fails on the ONNX model at {label}: {_first(exc)}; "
                f"{instead(signature or {})}"
            ) from None
    return results


def _initial_state(ep, signature: dict) -> list:
    from aotc.export.call_structure import initial_state

    return initial_state(ep, signature, "cpu")


def read_onnx_model(path: Path) -> tuple[object, OnnxModelInfo]:
    """An ONNX file written by `aotc export --format onnx`, with the signature it carries."""
    require_onnx()
    import onnx

    try:
        model = onnx.load(str(path))
    except Exception as exc:
        raise UserInputError(f"{path} is not an ONNX model ({_first(exc)})") from None
    props = metadata(model)
    if SIGNATURE_KEY not in props:
        raise UserInputError(
            f"{path} carries no aotc signature; make it with `aotc export MODEL --format onnx` "
            "(or build from the .pt2 artifact with --backend onnxruntime)"
        )
    try:
        signature = json.loads(props[SIGNATURE_KEY])
        check = json.loads(props.get(CHECK_KEY, "{}"))
    except ValueError:
        raise UserInputError(
            f"{path}: its {SIGNATURE_KEY} metadata is not JSON; export it again"
        ) from None
    return model, OnnxModelInfo(signature, props.get(MODEL_KEY) or None, check)
