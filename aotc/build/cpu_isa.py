"""The instruction set a CPU package is compiled for (`aotc build --cpu-isa`), and the record of it.

Inductor compiles CPU kernels with `-march=native` plus the vector ISA it picks for the build
machine (AVX-512, AMX where present): such a package dies with SIGILL on an older CPU. A named ISA
sets both halves, `cpp.march` and `cpp.simdlen`, to a portable level (x86-64 microarchitecture levels:
v3 = AVX2/FMA, v4 = AVX-512 F/DQ/BW/VL). Whatever the choice, the manifest records the extensions
the compiler was allowed to use, read from the compiler itself (`-dM -E` lists the macros each
enabled extension defines), so the runtime can refuse a CPU that lacks one, naming it.
"""

from __future__ import annotations

import platform
import subprocess

from aotc.errors import UserInputError

# name -> (cpp.march, cpp.simdlen); native leaves Inductor's defaults (-march=native, best vector ISA)
ISAS = {"native": (None, None), "avx2": ("x86-64-v3", 256), "avx512": ("x86-64-v4", 512)}

# The compiler's macro for each x86 extension -> the flag /proc/cpuinfo shows when the CPU has it.
# Only extensions the compiler emits on its own (vector code, bit manipulation) or that Inductor's
# kernels use through intrinsics (AMX); crypto and random-number instructions (AES, SHA, RDSEED...)
# appear only where source code asks for them, and a VM may hide their flags (seen: RDSEED).
MACRO_FEATURES = {
    "__SSE3__": "pni",
    "__SSSE3__": "ssse3",
    "__SSE4_1__": "sse4_1",
    "__SSE4_2__": "sse4_2",
    "__POPCNT__": "popcnt",
    "__AVX__": "avx",
    "__AVX2__": "avx2",
    "__FMA__": "fma",
    "__F16C__": "f16c",
    "__BMI__": "bmi1",
    "__BMI2__": "bmi2",
    "__LZCNT__": "abm",
    "__MOVBE__": "movbe",
    "__AVXVNNI__": "avx_vnni",
    "__AVX512F__": "avx512f",
    "__AVX512DQ__": "avx512dq",
    "__AVX512CD__": "avx512cd",
    "__AVX512BW__": "avx512bw",
    "__AVX512VL__": "avx512vl",
    "__AVX512IFMA__": "avx512ifma",
    "__AVX512VBMI__": "avx512vbmi",
    "__AVX512VBMI2__": "avx512_vbmi2",
    "__AVX512VNNI__": "avx512_vnni",
    "__AVX512BITALG__": "avx512_bitalg",
    "__AVX512VPOPCNTDQ__": "avx512_vpopcntdq",
    "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16",
    "__AMX_TILE__": "amx_tile",
    "__AMX_BF16__": "amx_bf16",
    "__AMX_INT8__": "amx_int8",
}


def is_x86() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def isa_options(name: str) -> dict:
    """The Inductor options that compile for ISA `name` (none for native)."""
    if name not in ISAS:
        raise UserInputError(f"--cpu-isa {name} is not one of {', '.join(ISAS)}")
    march, simdlen = ISAS[name]
    if march is None:
        return {}
    if not is_x86():
        raise UserInputError(
            f"--cpu-isa {name} is an x86-64 level and this machine is {platform.machine()}; "
            "build with --cpu-isa native"
        )
    from torch._inductor import config

    if not hasattr(config.cpp, "march"):
        raise UserInputError(
            f"--cpu-isa {name} needs an Inductor with the cpp.march option, and this torch's has "
            "none; build with --cpu-isa native or upgrade torch"
        )
    return {"cpp.march": march, "cpp.simdlen": simdlen}


def compiled_features(name: str, cxx: str) -> tuple[str, ...]:
    """The /proc/cpuinfo names of the extensions a package built for `name` may use: the macros
    `cxx` defines under the -march and vector-ISA flags Inductor will pass."""
    if not is_x86():
        return ()
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import invalid_vec_isa, pick_vec_isa

    march, simdlen = ISAS[name]
    with config.patch({"cpp.simdlen": simdlen}):
        vec_isa = pick_vec_isa()
    if simdlen is not None and vec_isa == invalid_vec_isa:
        raise UserInputError(
            f"--cpu-isa {name} needs a build machine whose CPU has it (the build runs the package "
            "for its numeric check), and this one does not; build with --cpu-isa avx2 or native"
        )
    flags = [f"-march={march or 'native'}", *vec_isa.build_arch_flags().split()]
    try:
        result = subprocess.run(
            [cxx, *flags, "-dM", "-E", "-x", "c++", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserInputError(
            f"could not ask {cxx} which CPU features it compiles for: {exc}"
        ) from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserInputError(f"{cxx} {' '.join(flags)} failed ({last}); check the compiler")
    defined = {
        line.split()[1] for line in result.stdout.splitlines() if line.startswith("#define ")
    }
    return tuple(sorted(feature for macro, feature in MACRO_FEATURES.items() if macro in defined))
