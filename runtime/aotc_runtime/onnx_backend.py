"""Packages whose model is an ONNX graph run by ONNX Runtime (`aotc build --backend onnxruntime`).

The session is wrapped in the interface of AOTInductor's package loader that Package uses (`run` on
a flat list of tensors, `get_call_spec`, `get_metadata`), so every runtime check, the signature,
state and output structures work unchanged. onnxruntime is imported only here, only for such a
package: the runtime's one hard dependency stays torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .errors import MissingDependencyError, PackageError

ONNX_FILE = "model.onnx"
ONNXRUNTIME_PIN = "onnxruntime==1.31.1"  # requirements.txt's pin, and the `aotc[onnx]` extra's


def import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError(
            f"this package runs on ONNX Runtime, which cannot be imported ({exc}); "
            f"pip install {ONNXRUNTIME_PIN} (or pip install 'aotc[onnx]')"
        ) from None
    return onnxruntime


def onnxruntime_version() -> str | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return str(onnxruntime.__version__)


class OnnxRuntimeLoader:
    """An ONNX Runtime session behind the loader interface Package calls."""

    def __init__(self, session: Any, n_outputs: int):
        self._session = session
        self._inputs = [i.name for i in session.get_inputs()]
        self._outputs = [o.name for o in session.get_outputs()]
        self._n_outputs = n_outputs

    def run(self, flat: list[torch.Tensor]) -> list[torch.Tensor]:
        # ONNX Runtime reads numpy arrays; CPU tensors share their memory with them (no copy).
        feeds = {
            name: tensor.detach().cpu().contiguous().numpy()
            for name, tensor in zip(self._inputs, flat)
        }
        return [torch.from_numpy(array) for array in self._session.run(self._outputs, feeds)]

    def get_call_spec(self) -> list[str]:
        flat_outputs = pytree.tree_structure(list(range(self._n_outputs)))
        return ["", pytree.treespec_dumps(flat_outputs)]

    def get_metadata(self) -> dict[str, str]:
        return dict(self._session.get_modelmeta().custom_metadata_map)


def open_session(path: Path, n_outputs: int, threads: int) -> OnnxRuntimeLoader:
    """The package's optimized model in a session that does not optimize again (it was, at build)."""
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # A session's run() is thread-safe; `threads` callers share the cores as the README advises.
    cores = os.cpu_count() or 1
    options.intra_op_num_threads = max(1, cores // max(1, threads))
    try:
        session = ort.InferenceSession(
            str(path / ONNX_FILE), options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime's own exception types (Fail, InvalidGraph, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PackageError(
            f"package {path} could not be loaded by ONNX Runtime: {first[:300]}; rebuild it with "
            "`aotc build --backend onnxruntime --force`"
        ) from None
    return OnnxRuntimeLoader(session, n_outputs)
