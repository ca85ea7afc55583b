"""What the package was built with versus what is running, and the refusal when they differ.

An AOTInductor shared object is tied to the torch release whose C shim it was compiled against,
and CUDA kernels (cubins) to the GPU architecture they were compiled for, so both are checked
before anything native is loaded.
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

import torch

from .errors import PackageError

if TYPE_CHECKING:
    from .manifest import Device, Manifest


def torch_release(version: str) -> str:
    """'2.13.0+cpu' -> '2.13.0': the local build tag does not change the C++ ABI of the shim."""
    return version.split("+", 1)[0]


def running_environment() -> dict:
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system().lower()}-{platform.machine()}",
        "cuda": torch.version.cuda,
    }
    return env


def gpu_description(device_index: int = 0) -> dict:
    props = torch.cuda.get_device_properties(device_index)
    return {"gpu_name": props.name, "compute_capability": f"{props.major}.{props.minor}"}


def check_compatible(manifest: Manifest, package_path: object) -> None:
    """Raise PackageError naming what the package was built with and what is running."""
    built = manifest.toolchain
    running = running_environment()
    where = f"package {package_path}"
    if manifest.backend == "onnxruntime":
        _check_onnxruntime(manifest, where)
    elif torch_release(built.torch) != torch_release(running["torch"]):
        raise PackageError(
            f"{where} was built with torch {built.torch}, this process runs torch {running['torch']}; "
            "rebuild it with `aotc build` on a machine with this torch, or run it where that torch is installed"
        )
    if built.platform and built.platform != running["platform"]:
        raise PackageError(
            f"{where} was built for {built.platform}, this machine is {running['platform']}; rebuild it here"
        )
    _check_cpu(manifest.device, where)
    if manifest.device.type == "cuda":
        _check_gpu(manifest.device, where)


def _check_onnxruntime(manifest: Manifest, where: str) -> None:
    """An ONNX Runtime package needs ONNX Runtime, and the release that optimized its graph: an
    optimized graph holds that release's fused operators and layouts (not the torch ABI)."""
    from .onnx_backend import import_onnxruntime

    here = str(import_onnxruntime().__version__)
    built = str(manifest.backend_options.get("onnxruntime", here))
    if built != here:
        raise PackageError(
            f"{where} was optimized by ONNX Runtime {built}, this process has {here}; rebuild it with "
            "`aotc build --backend onnxruntime` here, or install that release"
        )


CPUINFO_ENV = "AOTC_CPUINFO"  # another cpuinfo file to read (tests play an older CPU with it)


def cpu_features() -> set[str] | None:
    """This CPU's feature flags as /proc/cpuinfo names them; None where there is no such file."""
    path = os.environ.get(CPUINFO_ENV, "/proc/cpuinfo")
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        return None
    return None


def _check_cpu(device: Device, where: str) -> None:
    """A package compiled with extensions this CPU lacks would die with SIGILL: refuse it first."""
    if not device.cpu_features:
        return
    here = cpu_features()
    if here is None:  # not Linux: nothing to compare with (the build's platform check applies)
        return
    missing = [feature for feature in device.cpu_features if feature not in here]
    if missing:
        raise PackageError(
            f"{where} was compiled for CPU features this CPU lacks: {', '.join(missing)} "
            f"(--cpu-isa {device.cpu_isa}); rebuild it with `aotc build --cpu-isa avx2` for any "
            "x86-64-v3 CPU, or on this machine"
        )


def _check_gpu(device: Device, where: str) -> None:
    if not torch.cuda.is_available():
        raise PackageError(
            f"{where} was built for CUDA ({device.gpu_name}), but this machine has no usable GPU; "
            "build a CPU package with `aotc build --device cpu`"
        )
    here = gpu_description(torch.cuda.current_device())
    if here["compute_capability"] != device.compute_capability:
        raise PackageError(
            f"{where} was built for {device.gpu_name} (compute capability {device.compute_capability}), "
            f"this GPU is {here['gpu_name']} ({here['compute_capability']}); rebuild it on this GPU's architecture"
        )
