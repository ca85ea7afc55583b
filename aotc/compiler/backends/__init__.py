"""Build backends: what turns an artifact into a package's compiled model. Each is one module here
with the same entry point,

    build(cfg: BuildConfig, progress: Progress, started: float) -> BuildResult

which loads the artifact, compiles, writes the manifest and runs the numeric check, and ends with
the shared `aotc.compiler.finish.finish` (check record, final manifest, rename into place).
aotc/compiler/pipeline.py picks one by `cfg.backend` (`aotc build --backend NAME`); a new backend is a
new module and one line in BACKENDS. Modules are imported when used: a backend's libraries
(onnxruntime) are optional extras, and naming the backends must not import them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aotc.errors import UserInputError

if TYPE_CHECKING:
    from aotc.compiler.finish import BuildResult
    from aotc.config import BuildConfig
    from aotc.progress import Progress


@dataclass(frozen=True)
class Backend:
    name: str
    module: str  # under aotc.compiler.backends, holding build()
    summary: str

    def build(self, cfg: BuildConfig, progress: Progress, started: float) -> BuildResult:
        return importlib.import_module(f"{__name__}.{self.module}").build(cfg, progress, started)


BACKENDS = {
    backend.name: backend
    for backend in (
        Backend("aotinductor", "inductor", "AOTInductor: C++/Triton kernels in a shared library"),
        Backend("onnxruntime", "onnxruntime", "ONNX Runtime (CPU; needs aotc[onnx])"),
    )
}


def backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UserInputError(
            f"--backend {name} is not one of {', '.join(BACKENDS)}; pick one of those"
        ) from None
