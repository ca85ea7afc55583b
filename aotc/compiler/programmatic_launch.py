"""`aotc build --pdl`: aotc's kernels in a CUDA package launched with Hopper's programmatic
dependent launch (PDL).

A batch-1 decode step is a chain of short kernels, each of which waits for the one before it to
finish before it even starts. With PDL a kernel is launched while its predecessor still runs: it
reads its weights, which nothing before it writes, and waits (griddepcontrol.wait) only before it
reads what its predecessor wrote. On an H200 the chain of SmolLM2-135M's fused products took 271
us a step that way against 418 without (scripts/pdl_chain.py, docs/benchmarks.md).

AOTInductor's C++ wrapper launches every Triton kernel with plain `cuLaunchKernel`, from a helper
(`launchKernel`) that Inductor's CUDA device overrides write into the wrapper's source. For the
build, this module registers overrides whose helper launches with the programmatic-serialization
attribute (`cuLaunchKernelEx`) the kernels whose names start with PDL_PREFIX, and every other
kernel as before. Only aotc's kernels carry the prefix (aotc/kernels/), and each of them waits
for its predecessor before reading anything a kernel writes and lets its successor start only
after that wait, so:
- a kernel of Inductor's or cuBLAS's after one of aotc's is launched plainly: it starts when its
  predecessor has finished, as without PDL;
- one of aotc's after another starts early and waits in the kernel; what the earlier one waited
  for has finished by the time the later one may start.
Outside such a package (the Python JIT path, a GPU below compute capability 9.0) the kernels'
wait and release are no-ops.
"""

from __future__ import annotations

import contextlib

from aotc.errors import BuildError

PDL_PREFIX = "aotc_pdl_"

# the helper Inductor writes (torch 2.11 to 2.13), replaced whole; any other form is refused
# rather than patched half-way
_PLAIN_LAUNCH = """static inline void launchKernel(
                    CUfunction func,
                    uint32_t gridX,
                    uint32_t gridY,
                    uint32_t gridZ,
                    uint32_t numWarps,
                    uint32_t sharedMemBytes,
                    void* args[],
                    cudaStream_t stream) {
                CUDA_DRIVER_CHECK(cuLaunchKernel(
                    func, gridX, gridY, gridZ, 32*numWarps, 1, 1, sharedMemBytes, stream, args, nullptr
                ));
            }"""

_PROGRAMMATIC_LAUNCH = (
    """static inline bool aotcLaunchesProgrammatically(CUfunction func) {
                // aotc's kernels (their names start with "PDL_PREFIX") wait for their
                // predecessor themselves; every other kernel is launched as before
                const char* name = nullptr;
                if (cuFuncGetName(&name, func) != CUDA_SUCCESS || name == nullptr) {
                    return false;
                }
                const char* prefix = "PDL_PREFIX";
                for (; *prefix != '\\0'; ++prefix, ++name) {
                    if (*name != *prefix) {
                        return false;
                    }
                }
                return true;
            }

            static inline void launchKernel(
                    CUfunction func,
                    uint32_t gridX,
                    uint32_t gridY,
                    uint32_t gridZ,
                    uint32_t numWarps,
                    uint32_t sharedMemBytes,
                    void* args[],
                    cudaStream_t stream) {
                if (aotcLaunchesProgrammatically(func)) {
                    CUlaunchAttribute attribute[1];
                    attribute[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                    attribute[0].value.programmaticStreamSerializationAllowed = 1;
                    CUlaunchConfig config = {};
                    config.gridDimX = gridX;
                    config.gridDimY = gridY;
                    config.gridDimZ = gridZ;
                    config.blockDimX = 32 * numWarps;
                    config.blockDimY = 1;
                    config.blockDimZ = 1;
                    config.sharedMemBytes = sharedMemBytes;
                    config.hStream = stream;
                    config.attrs = attribute;
                    config.numAttrs = 1;
                    CUDA_DRIVER_CHECK(cuLaunchKernelEx(&config, func, args, nullptr));
                    return;
                }
                CUDA_DRIVER_CHECK(cuLaunchKernel(
                    func, gridX, gridY, gridZ, 32*numWarps, 1, 1, sharedMemBytes, stream, args, nullptr
                ));
            }"""
).replace("PDL_PREFIX", PDL_PREFIX)


def programmatic_driver(source: str) -> str:
    """Inductor's CUDA kernel-driver source with the launch helper that launches aotc's kernels
    with PDL."""
    if source.count(_PLAIN_LAUNCH) != 1:
        raise BuildError(
            "--pdl: this torch's AOTInductor launches kernels in a form aotc does not know; "
            "build without --pdl"
        )
    return source.replace(_PLAIN_LAUNCH, _PROGRAMMATIC_LAUNCH)


@contextlib.contextmanager
def programmatic_launches(enabled: bool):
    """Within it, AOTInductor writes CUDA wrappers whose launcher launches aotc's kernels with
    PDL (when `enabled`); the usual overrides are back after it."""
    if not enabled:
        yield
        return
    import torch._inductor.codegen.cuda.device_op_overrides  # noqa: F401  (registers CUDA's)
    from torch._inductor.codegen import common

    plain = common.get_device_op_overrides("cuda")  # registers Inductor's own first

    class ProgrammaticLaunches(type(plain)):  # type: ignore[misc]
        def kernel_driver(self) -> str:
            return programmatic_driver(super().kernel_driver())

    programmatic_driver(plain.kernel_driver())  # an unknown form refused before compiling
    common.register_device_op_overrides("cuda", ProgrammaticLaunches())
    try:
        yield
    finally:
        common.register_device_op_overrides("cuda", plain)
