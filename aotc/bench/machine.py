"""What a benchmark ran on: CPU, GPU, threads and versions, recorded beside every figure."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

from aotc import __version__


def machine_description(device) -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "platform": f"{platform.system().lower()}-{platform.machine()}",
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "aotc": __version__,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_gb=round(props.total_memory / 2**30, 1),
            cudnn=torch.backends.cudnn.version(),
        )
        with contextlib.suppress(ImportError):
            import triton

            info["triton"] = triton.__version__
    return info
