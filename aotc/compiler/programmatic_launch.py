"""`aotc build --pdl`: the kernels of a CUDA package launched with Hopper's programmatic dependent
launch (PDL) where they wait for their predecessor themselves.

A batch-1 decode step is a chain of short kernels, each of which waits for the one before it to
finish before it even starts. With PDL a kernel is launched while its predecessor still runs: it
reads what nothing before it writes (a product's weights) and waits (griddepcontrol.wait) only
before it reads what its predecessor wrote. On an H200 the chain of SmolLM2-135M's fused products
took 271 us a step that way against 418 without (scripts/pdl_chain.py, docs/benchmarks.md).

AOTInductor's C++ wrapper launches every Triton kernel with plain `cuLaunchKernel`, from a helper
(`launchKernel`) that Inductor's CUDA device overrides write into the wrapper's source. For the
build, this module registers overrides whose helper launches with the programmatic-serialization
attribute (`cuLaunchKernelEx`) the kernels whose names start with one of the given prefixes, and
every other kernel as before:
- aotc's kernels (aotc/kernels/, named `aotc_pdl_*`): each waits for its predecessor before it
  reads anything a kernel writes, and lets its successor start only after that wait;
- with Inductor's `triton.enable_pdl` (on with --pdl unless `--option triton.enable_pdl=false`),
  Inductor's pointwise, persistent-reduction and reduction kernels, which Inductor then writes
  with the same wait and release (its templates, `triton_tem_*`, get neither and stay plain).
A kernel launched plainly (cuBLAS's, a template) starts when its predecessor has finished, as
without PDL; a kernel launched early waits in the kernel, and whatever its predecessor waited
for has finished before the predecessor let it start. Outside such a package (the Python JIT
path, a GPU below compute capability 9.0) the wait and the release are no-ops.
"""

from __future__ import annotations

import contextlib

from aotc.errors import BuildError

PDL_PREFIX = "aotc_pdl_"
# Inductor's kernels that carry the wait and the release under triton.enable_pdl
INDUCTOR_PDL_PREFIXES = ("triton_poi_", "triton_per_", "triton_red_")

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

# written before the plain helper: whether a kernel is launched programmatically, by its name
_BY_NAME = """static inline bool aotcLaunchesProgrammatically(CUfunction func) {
                // the kernels that wait for their predecessor themselves (by name); every other
                // kernel is launched as before
                static const char* const prefixes[] = {PREFIXES};
                const char* name = nullptr;
                if (cuFuncGetName(&name, func) != CUDA_SUCCESS || name == nullptr) {
                    return false;
                }
                for (const char* prefix : prefixes) {
                    const char* at = name;
                    const char* wanted = prefix;
                    while (*wanted != '\\0' && *at == *wanted) {
                        ++at;
                        ++wanted;
                    }
                    if (*wanted == '\\0') {
                        return true;
                    }
                }
                return false;
            }

            """
# put at the start of the plain helper's body: the named kernels launched with the attribute,
# the rest fall through to the plain launch
_BODY = "cudaStream_t stream) {\n"
_PROGRAMMATIC_BRANCH = """                if (aotcLaunchesProgrammatically(func)) {
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
"""
_PROGRAMMATIC_LAUNCH = _BY_NAME + _PLAIN_LAUNCH.replace(_BODY, _BODY + _PROGRAMMATIC_BRANCH, 1)


def programmatic_driver(source: str, prefixes: tuple = (PDL_PREFIX,)) -> str:
    """Inductor's CUDA kernel-driver source with the launch helper that launches the kernels
    whose names start with one of `prefixes` with PDL."""
    if source.count(_PLAIN_LAUNCH) != 1:
        raise BuildError(
            "--pdl: this torch's AOTInductor launches kernels in a form aotc does not know; "
            "build without --pdl"
        )
    listed = ", ".join(f'"{prefix}"' for prefix in prefixes)
    return source.replace(
        _PLAIN_LAUNCH, _PROGRAMMATIC_LAUNCH.replace("{PREFIXES}", "{" + listed + "}")
    )


def launched_prefixes(options: dict) -> tuple:
    """The kernel-name prefixes a --pdl build launches with PDL, given its Inductor options."""
    inductor = bool(options.get("triton.enable_pdl"))
    return (PDL_PREFIX, *(INDUCTOR_PDL_PREFIXES if inductor else ()))


@contextlib.contextmanager
def programmatic_launches(prefixes: tuple):
    """Within it, AOTInductor writes CUDA wrappers whose launcher launches the kernels named with
    `prefixes` with PDL (none: the usual launcher); the usual overrides are back after it."""
    if not prefixes:
        yield
        return
    import torch._inductor.codegen.cuda.device_op_overrides  # noqa: F401  (registers CUDA's)
    from torch._inductor.codegen import common

    plain = common.get_device_op_overrides("cuda")  # registers Inductor's own first

    class ProgrammaticLaunches(type(plain)):  # type: ignore[misc]
        def kernel_driver(self) -> str:
            return programmatic_driver(super().kernel_driver(), prefixes)

    programmatic_driver(plain.kernel_driver(), prefixes)  # an unknown form refused before compiling
    common.register_device_op_overrides("cuda", ProgrammaticLaunches())
    try:
        yield
    finally:
        common.register_device_op_overrides("cuda", plain)
