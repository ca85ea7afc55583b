"""Load a package folder and call it like the model it came from.

Loading goes straight to the C++ AOTInductor package loader (torch._C._aoti): no torch._inductor
import, no compilation, no Python-side warm-up, which is what keeps cold start near `import torch`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from .environment import check_compatible
from .errors import PackageError
from .manifest import MODEL_FILE, read_manifest, verify_files
from .signature import Signature


class Package:
    """A loaded package: `Package(*tensors)` runs it; `.manifest` and `.signature` describe it."""

    def __init__(self, path: Path, manifest: dict, loader):
        self.path = Path(path)
        self.manifest = manifest
        self.signature = Signature.from_dict(manifest["signature"])
        self.device = torch.device(manifest["device"]["type"], 0) if manifest["device"]["type"] == "cuda" else torch.device("cpu")
        self._loader = loader
        self._out_spec = pytree.treespec_loads(loader.get_call_spec()[1])
        self._call_flat = self._run_loader
        if manifest.get("runtime", {}).get("cuda_graphs") and self.device.type == "cuda":
            from .cuda_graphs import CudaGraphRunner  # only CUDA packages built with reduce-overhead need it

            self._call_flat = CudaGraphRunner(self._run_loader, self.device)

    def __call__(self, *tensors):
        self.signature.check_inputs(tensors)
        flat = [t if t.device == self.device else t.to(self.device) for t in tensors]
        outputs = self._call_flat(flat)
        return pytree.tree_unflatten(list(outputs), self._out_spec)

    def _run_loader(self, flat):
        return self._loader.run(flat)

    def __repr__(self) -> str:
        return f"Package({str(self.path)!r}, device={self.device}, mode={self.manifest['mode']!r})"


def load(path, verify: bool = True) -> Package:
    """Open a package folder written by `aotc build`.

    Refuses (PackageError) a folder that is not a package, whose files differ from the manifest's
    hashes, or that was built for another torch release, platform or GPU architecture.
    `verify=False` skips only the hash check (for callers that just verified it).
    """
    path = Path(path)
    manifest = read_manifest(path)
    check_compatible(manifest, path)
    if verify:
        verify_files(path, manifest)
    if manifest.get("runtime", {}).get("tf32"):
        # A tf32 package was checked with TF32 matmuls/convs; aten kernels called from the package read these flags.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    device_index = 0 if manifest["device"]["type"] == "cuda" else -1
    single_threaded = bool(manifest.get("runtime", {}).get("cuda_graphs"))
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path / MODEL_FILE), "model", single_threaded, 1, device_index)
    except Exception as exc:  # the C++ loader raises RuntimeError with its own text
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PackageError(f"package {path} could not be loaded: {first_line}; rebuild it with `aotc build --force`") from exc
    return Package(path, manifest, loader)
