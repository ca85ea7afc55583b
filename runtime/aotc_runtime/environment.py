"""What the package was built with versus what is running, and the refusal when they differ.

An AOTInductor shared object is tied to the torch release whose C shim it was compiled against,
and CUDA kernels (cubins) to the GPU architecture they were compiled for, so both are checked
before anything native is loaded.
"""

from __future__ import annotations

import os
import platform
import sys
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
    _check_cpu_layout(manifest.device, where)
    if manifest.device.type == "cuda":
        _check_gpu(manifest.device, where)
        note = tuned_elsewhere(manifest, gpu_description(torch.cuda.current_device())["gpu_name"])
        if note:
            _say_once(f"{where}: {note}")


def tuned_elsewhere(manifest: Manifest, here: str) -> str | None:
    """What to say when the package's build chose kernel tiles by timing them on another GPU (of
    the same architecture: _check_gpu refuses any other): it runs correctly, maybe slower."""
    tuned_on = manifest.product_tiles.get("tuned_on")
    if not tuned_on or tuned_on == here:
        return None
    return (
        f"its fused products' tiles were chosen on {tuned_on}, this GPU is {here}: it runs "
        "correctly, maybe slower than a build made here; rebuild it on this GPU for tiles of its own"
    )


_SAID: set = set()


def _say_once(line: str) -> None:
    """A one-line note on stderr, once per process and line (a server loads a package per replica
    and per request path, and would repeat it)."""
    if line not in _SAID:
        _SAID.add(line)
        print(f"aotc_runtime: {line}", file=sys.stderr)


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
PROC_CPUINFO = "/proc/cpuinfo"
MAX_CPUINFO_BYTES = 16 << 20  # a 512-core machine's /proc/cpuinfo is a few MB


def cpu_features() -> set[str] | None:
    """This CPU's feature flags as /proc/cpuinfo (or $AOTC_CPUINFO) names them; None where they
    cannot be read (not Linux)."""
    flags, _problem = _read_cpu_flags(os.environ.get(CPUINFO_ENV) or PROC_CPUINFO)
    return flags


def _read_cpu_flags(path: str) -> tuple[set[str] | None, str]:
    """The flags of a cpuinfo file, or None and why not ("cannot be read (...)", "has no flags line").

    Opened without blocking and refused unless it is a regular file: a FIFO named by
    $AOTC_CPUINFO would otherwise hang the load (the C++ runner reads it the same way)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or type(exc).__name__})"
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a folder itself
        os.close(fd)
        return None, "is not a regular file"
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(MAX_CPUINFO_BYTES + 1)
        except OSError as exc:
            return None, f"cannot be read ({exc.strerror or type(exc).__name__})"
    if len(data) > MAX_CPUINFO_BYTES:
        return None, f"is larger than {MAX_CPUINFO_BYTES >> 20} MiB"
    for line in data.decode("ascii", errors="replace").splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split()), ""
    return None, "has no flags line"


def _check_cpu(device: Device, where: str) -> None:
    """A package compiled with extensions this CPU lacks would die with SIGILL: refuse it first."""
    if not device.cpu_features:
        return
    override = os.environ.get(CPUINFO_ENV)
    here, problem = _read_cpu_flags(override or PROC_CPUINFO)
    if here is None and override:
        # Fail closed: a cpuinfo file that was asked for and cannot be used must not skip the check.
        raise PackageError(
            f"{where} lists the CPU features it was compiled for, which cannot be checked: "
            f"${CPUINFO_ENV} is {override}, which {problem}; point {CPUINFO_ENV} at a cpuinfo "
            f"file, or unset it to read {PROC_CPUINFO}"
        )
    if here is None:  # not Linux: nothing to compare with (the build's platform check applies)
        return
    missing = [feature for feature in device.cpu_features if feature not in here]
    if missing:
        raise PackageError(
            f"{where} was compiled for CPU features this CPU lacks: {', '.join(missing)} "
            f"(--cpu-isa {device.cpu_isa}); rebuild it with `aotc build --cpu-isa avx2` for any "
            "x86-64-v3 CPU, or on this machine"
        )


def _check_cpu_layout(device: Device, where: str) -> None:
    """torch's CPU int4 kernel lays its weights out per CPU capability (64 or 32 output features
    to a block, interleaved differently), chosen when torch starts: weights packed for another
    capability are read as wrong numbers, with no error. Refuse them."""
    wanted = device.aten_cpu_capability
    if wanted is None:
        return
    here = torch.backends.cpu.get_cpu_capability()
    if here != wanted:
        raise PackageError(
            f"{where} stores int4 weights in the layout of torch's {wanted} CPU kernels, but torch "
            f"here runs its {here} kernels (this CPU, or $ATEN_CPU_CAPABILITY); rebuild it on a "
            f"machine where torch runs {here}, or run it where torch runs {wanted}"
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
