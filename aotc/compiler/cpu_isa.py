"""The instruction set a CPU package is compiled for (`aotc build --cpu-isa`), and the record of it.

Inductor compiles CPU kernels with `-march=native` plus the vector ISA it picks for the build
machine (AVX-512, AMX where present): such a package dies with SIGILL on an older CPU. A named ISA
sets both halves, `cpp.march` and `cpp.simdlen`, to a portable level (x86-64 microarchitecture levels:
v3 = AVX2/FMA, v4 = AVX-512 F/DQ/BW/VL). Whatever the choice, the manifest records the extensions
the compiler was allowed to use, read from the compiler itself (`-dM -E` lists the macros each
enabled extension defines), so the runtime can refuse a CPU that lacks one, naming it.

Inductor decides which vector ISAs it may use by compiling and running a test program for each
one the CPU claims (`valid_vec_isa_list`): ten compiler runs, 12 s on the 2-core CPU VM and about
40 s on the H100 host, once per process, and every build is a new process (each --tune
candidate too), CUDA builds included (AOTInductor picks an ISA for any package's host code). The
answer depends only on the compiler, torch and the CPU, so each probe's answer is kept in aotc's
cache folder (remembered_vec_isa_probes): a machine pays for each probe once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import platform
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from aotc.config import ISAS
from aotc.errors import UserInputError

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


@contextlib.contextmanager
def remembered_vec_isa_probes(cxx: str, device: str = "cpu") -> Iterator[ProbeCount]:
    """Inside: each of Inductor's vector-ISA probes (VecISA.check_build: compile a test program
    with one ISA's flags, load it in a child) answers from aotc's cache folder when this compiler,
    torch and CPU already answered it, and is remembered when not. Every probe goes through that
    one method, the subclasses' extra ones too (AVX-512 BF16 and VNNI, AMX, AMX-FP16: 4 of the
    H100 host's 14), so the flags Inductor picks are exactly what the probe would have given.
    Builds running at once take turns on each answer (a lock per probe), so a machine runs each
    probe once however many builds start together. A cache others can write is not used (the
    probe runs, as without aotc). Yields the count and time of the probes that really ran, for
    the build's stage times.

    A CUDA package's CPU code is its host-side wrapper, not vector kernels, so a CUDA build does
    not pay for test programs at all: an ISA is taken when the compiler accepts its flags and
    every extension they enable is one the CPU reports (`compiler_and_cpu_have`), a check of a
    few milliseconds that the probe's compile-and-run would confirm on any sane machine."""
    from torch._inductor import cpu_vec_isa

    count = ProbeCount()
    real = cpu_vec_isa.VecISA.check_build
    if device == "cuda":

        def light(self, code, *args, **kwargs):
            return compiler_and_cpu_have(cxx, self.build_arch_flags())

        cpu_vec_isa.VecISA.check_build = light
    else:
        cpu_vec_isa.VecISA.check_build = _remembering(real, cxx, count)
    try:
        yield count
    finally:
        cpu_vec_isa.VecISA.check_build = real


def _remembering(real, cxx: str, count: ProbeCount):
    """`real` (VecISA.check_build) answering from, and writing to, aotc's cache folder."""
    from aotc.cache_dir import private_cache_root

    try:
        folder = private_cache_root() / "cpu-isa"
    except UserInputError:
        folder = None
    base = _probe_context(cxx)

    @functools.wraps(real)
    def remembered(self, code, *args, **kwargs):
        def probe() -> bool:
            began = time.perf_counter()
            ok = real(self, code, *args, **kwargs)
            count.runs += 1
            count.seconds += time.perf_counter() - began
            return ok

        if folder is None:
            return probe()
        path = folder / f"{_probe_key(base, self.build_arch_flags(), code)}.json"
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(path.with_suffix(".lock")):
            try:
                return bool(json.loads(path.read_text())["ok"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
            ok = probe()
            _remember(path, ok)
            return ok

    return remembered


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path`, held inside (a later build waits for the first's answer)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def compiler_and_cpu_have(cxx: str, arch_flags: str) -> bool:
    """Whether `cxx` accepts `arch_flags` and this CPU reports every extension they enable."""
    defined = _macros(cxx, arch_flags.split())
    if defined is None:
        return False
    reported = set(" ".join(_cpu_identity()).split())
    return all(feature in reported for macro, feature in MACRO_FEATURES.items() if macro in defined)


def _macros(cxx: str, flags: list) -> set | None:
    """The macros `cxx` defines under `flags`; None when it refuses them."""
    try:
        result = _preprocess(cxx, flags)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return _defined(result.stdout) if result.returncode == 0 else None


def _preprocess(cxx: str, flags: list) -> subprocess.CompletedProcess:
    """`cxx` listing the macros it defines under `flags` (no program is compiled)."""
    return subprocess.run(
        [cxx, *flags, "-dM", "-E", "-x", "c++", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _defined(listing: str) -> set:
    return {line.split()[1] for line in listing.splitlines() if line.startswith("#define ")}


@dataclasses.dataclass
class ProbeCount:
    runs: int = 0
    seconds: float = 0.0


def _probe_context(cxx: str) -> dict:
    """What a probe's answer depends on besides its own flags and program: the compiler, torch,
    and the CPU (its model and every flag the kernel reports)."""
    import torch

    try:
        version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()[:1]
    except (OSError, subprocess.TimeoutExpired):
        version = []
    return {"cxx": cxx, "cxx_version": version, "torch": torch.__version__, "cpu": _cpu_identity()}


def _cpu_identity() -> list:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return [platform.machine(), platform.processor()]
    wanted = ("model name", "flags")
    return sorted({line.strip() for line in lines if line.split(":")[0].strip() in wanted})


def _probe_key(context: dict, arch_flags: str, code: str) -> str:
    record = {**context, "arch_flags": arch_flags, "code": code}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:32]


def _remember(path: Path, ok: bool) -> None:
    from aotc_runtime import write_text_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps({"ok": bool(ok)}) + "\n")


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
        result = _preprocess(cxx, flags)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserInputError(
            f"could not ask {cxx} which CPU features it compiles for: {exc}"
        ) from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserInputError(f"{cxx} {' '.join(flags)} failed ({last}); check the compiler")
    defined = _defined(result.stdout)
    return tuple(sorted(feature for macro, feature in MACRO_FEATURES.items() if macro in defined))
