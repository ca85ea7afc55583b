"""One cold start of `aotc bench`, in a fresh process: import torch, load the contender, call once.

usage: python -m aotc.bench.cold_child SPEC_JSON   (SPEC: see aotc.bench.cold.child_spec)
Prints two JSON lines: the phases (import, load, first call, in ms), then the process's peak memory.
The parent's clock runs from the spawn to the first line, so interpreter start counts too. Only the
standard library is imported before torch: what is timed is what a user's process would pay.
"""

import json
import resource
import sys
import time

began = time.perf_counter()


def main(spec: dict) -> None:
    import torch

    imported = time.perf_counter()
    device = torch.device(spec["device"])
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = spec["tf32"]
        torch.zeros(1, device=device)  # the CUDA context, which any model on this GPU needs
        free_at_start = torch.cuda.mem_get_info(device)[0]
    model = load_contender(spec, device)
    loaded = time.perf_counter()
    import aotc_runtime

    inputs = aotc_runtime.Signature.from_json(spec["signature"]).random_inputs(
        seed=0, device=device
    )
    with torch.inference_mode():
        model(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    done = time.perf_counter()
    phases = {
        "import_ms": (imported - began) * 1e3,
        "load_ms": (loaded - imported) * 1e3,
        "first_call_ms": (done - loaded) * 1e3,
    }
    print(json.dumps(phases), flush=True)
    memory = {"peak_rss_mb": peak_rss_mb()}
    if device.type == "cuda":
        memory["cuda_allocator_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        # AOTInductor allocates a package's weights with cudaMalloc, outside the caching allocator.
        memory["cuda_device_used_mb"] = (free_at_start - torch.cuda.mem_get_info(device)[0]) / 2**20
    print(json.dumps(memory), flush=True)


def load_contender(spec: dict, device):
    import torch

    if spec["kind"] in ("package", "onnxruntime"):  # onnxruntime: an ONNX Runtime package
        import aotc_runtime

        return aotc_runtime.load(spec["package"])
    program = torch.export.load(spec["artifact"])
    if spec["precision"] in ("bf16", "fp16") or device.type != "cpu":
        # The same placement the build's eager reference gets: reduced precision, and on a GPU the
        # CPU-traced views made reshapes (vit_b_16's attention strides differ there). Importing
        # aotc for it adds about 11 ms to the baseline's seconds-long cold start.
        from aotc.config import Precision
        from aotc.export.placement import place_program

        program = place_program(
            program, device.type, Precision(spec["precision"]), spec["signature"]
        )
    model = program.module()
    return torch.compile(model, mode=spec["mode"]) if spec["kind"] == "compile" else model


def peak_rss_mb() -> float:
    try:  # VmHWM: ru_maxrss would carry the parent's peak over the exec on Linux
        with open("/proc/self/status") as status:
            return int(status.read().split("VmHWM:")[1].split()[0]) / 1024
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
