"""The instruction set a CPU package is compiled for (`aotc build --cpu-isa`), and the record of it.

Inductor compiles CPU kernels with `-march=native` plus the vector ISA it picks for the build
machine (AVX-512, AMX where present): such a package dies with SIGILL on an older CPU. A named ISA
sets both halves, `cpp.march` and `cpp.simdlen`, to a portable level (x86-64 microarchitecture levels:
v3 = AVX2/FMA, v4 = AVX-512 F/DQ/BW/VL). Whatever the choice, the manifest records the extensions
the compiler was allowed to use, read from the compiler itself (`-dM -E` lists the macros each
enabled extension defines), so the runtime can refuse a CPU that lacks one, naming it.

Inductor decides which vector ISAs it may use by compiling and running a test program for each
one the CPU claims (`valid_vec_isa_list`): ten compiler runs, 12 s on the 2-core CPU VM and about
40 s on the H100 host (issue 25), once per process, and every build is a new process (each --tune
candidate too), CUDA builds included (AOTInductor picks an ISA for any package's host code). The
answer depends only on the compiler, torch and the CPU, so it is kept in aotc's cache folder
(trusted_vec_isa_options): a machine pays for the probe once.
"""

from __future__ import annotations

import hashlib
import json
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


def trusted_vec_isa_options(cxx: str) -> dict:
    """{"cpp.vec_isa_ok": True} when Inductor's probe already ran for this compiler, torch and CPU
    and every vector ISA the CPU claims passed it: Inductor then takes the CPU's word and skips the
    probe, which is what the probe would have answered. Otherwise the probe runs (in this process,
    where Inductor's own call reuses its answer) and the answer is kept for the next build. An
    ISA that failed the probe (a compiler too old for AMX, say) keeps the probe on every time."""
    if not is_x86():
        return {}
    from torch._inductor.cpu_vec_isa import supported_vec_isa_list, x86_isa_checker

    from aotc.cache_dir import private_cache_root

    cpu_flags = set(x86_isa_checker())
    claimed = [str(i) for i in supported_vec_isa_list if set(str(i).split()) <= cpu_flags]
    try:
        folder = private_cache_root() / "cpu-isa"
    except UserInputError:  # a cache others can write: probe every time rather than trust it
        return {}
    path = folder / f"{_probe_key(cxx, claimed)}.json"
    try:
        valid = json.loads(path.read_text())["valid"]
    except (OSError, ValueError, KeyError, TypeError):
        valid = _probe_and_remember(path)
    return {"cpp.vec_isa_ok": True} if valid == claimed else {}


def _probe_key(cxx: str, claimed: list) -> str:
    import torch

    try:
        version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()[:1]
    except (OSError, subprocess.TimeoutExpired):
        version = []
    record = {"cxx": cxx, "cxx_version": version, "torch": torch.__version__, "claimed": claimed}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:32]


def _probe_and_remember(path) -> list:
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    from aotc_runtime import write_text_atomically

    valid = [str(isa) for isa in valid_vec_isa_list()]  # the probe
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps({"valid": valid}) + "\n")
    return valid


def compiled_features(name: str, cxx: str, trusted: dict | None = None) -> tuple[str, ...]:
    """The /proc/cpuinfo names of the extensions a package built for `name` may use: the macros
    `cxx` defines under the -march and vector-ISA flags Inductor will pass. `trusted`: what
    trusted_vec_isa_options gave, applied here as it will be to the compile."""
    if not is_x86():
        return ()
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import invalid_vec_isa, pick_vec_isa

    march, simdlen = ISAS[name]
    with config.patch({"cpp.simdlen": simdlen, **(trusted or {})}):
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
