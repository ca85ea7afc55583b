"""Issue 14, finding 9: a CPU package records the instruction set it was compiled for, `--cpu-isa`
builds a portable one, and both runtimes refuse a CPU that lacks what a package needs."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch
from conftest import MLP, invoke

import aotc_runtime
from aotc.build.cpu_isa import compiled_features
from aotc.deploy.cpp_runner import runner_path
from aotc.errors import UserInputError

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 instruction-set levels"
)

# x86-64-v3 and what came before it: nothing an AVX2 machine lacks.
AVX2_LEVEL = {"abm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "pni", "popcnt"}
AVX2_LEVEL |= {"sse4_1", "sse4_2", "ssse3"}


@pytest.fixture(scope="module")
def avx2_package(tmp_path_factory):
    folder = tmp_path_factory.mktemp("isa")
    artifact = folder / "mlp.pt2"
    assert invoke("export", MLP, "--input-shape", "8x128", "-o", artifact).exit_code == 0
    result = invoke(
        "build", artifact, "--device", "cpu", "--cpu-isa", "avx2", "-o", folder / "pkg", "--quiet"
    )
    assert result.exit_code == 0, result.stderr
    return folder / "pkg"


def _disassembly(package) -> str:
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) not installed")
    with zipfile.ZipFile(package / "model.pt2") as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".so")]
        so = package.parent / "model.so"
        so.write_bytes(archive.read(name))
    return subprocess.run([objdump, "-d", str(so)], capture_output=True, text=True).stdout


def test_avx2_package_records_and_uses_no_more_than_avx2(avx2_package):
    manifest = json.loads((avx2_package / "manifest.json").read_text())
    assert manifest["device"]["cpu_isa"] == "avx2"
    features = set(manifest["device"]["cpu_features"])
    assert "avx2" in features and features <= AVX2_LEVEL
    assert manifest["inductor_options"]["cpp.march"] == "x86-64-v3"
    # The proof that matters on an older CPU: no AVX-512 register in the compiled code.
    assert "%zmm" not in _disassembly(avx2_package)
    assert manifest["numeric_check"]["passed"]


def test_native_package_records_what_the_compiler_enables(packages):
    manifest = aotc_runtime.load(packages.get("mlp").package).manifest
    assert manifest.device.cpu_isa == "native"
    compiler = manifest.toolchain.build_tools["cxx"]
    assert manifest.device.cpu_features == compiled_features("native", compiler)
    assert {"avx", "avx2"} & set(manifest.device.cpu_features) or not {"avx", "avx2"} & _flags()


def _flags() -> set:
    with open("/proc/cpuinfo") as handle:
        line = next(line for line in handle if line.startswith("flags"))
    return set(line.partition(":")[2].split())


def _older_cpu(tmp_path, without: str):
    """A cpuinfo file of this CPU minus one feature: the machine a package is moved to."""
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nflags\t\t: " + " ".join(sorted(_flags() - {without})) + "\n")
    return path


def test_a_cpu_lacking_a_feature_is_refused(avx2_package, tmp_path, monkeypatch):
    x = torch.randn(8, 128)
    assert aotc_runtime.load(avx2_package)(x).shape == (8, 10)  # this CPU has AVX2
    monkeypatch.setenv("AOTC_CPUINFO", str(_older_cpu(tmp_path, without="avx2")))
    result = invoke("run", avx2_package)
    assert result.exit_code == 7, result.stderr
    assert "compiled for CPU features this CPU lacks: avx2 (--cpu-isa avx2)" in result.stderr
    try:
        runner = runner_path()
    except UserInputError:  # `make test` builds it; a bare pytest run may not have
        return
    cpp = subprocess.run([str(runner), str(avx2_package)], capture_output=True, text=True)
    assert cpp.returncode == 7 and "this CPU lacks: avx2" in cpp.stderr, cpp.stderr


def test_unknown_isa_is_a_usage_error(tmp_path):
    result = invoke("build", tmp_path / "a.pt2", "--cpu-isa", "sse2")
    assert result.exit_code == 2 and "sse2" in result.stderr


PROBE_COUNT = """
import json, sys
from torch._inductor import cpu_vec_isa
from aotc.build.cpu_isa import compiled_features, remembered_vec_isa_probes

probes = []
real = cpu_vec_isa.VecISA.check_build
cpu_vec_isa.VecISA.check_build = lambda self, code: probes.append(str(self)) or real(self, code)
with remembered_vec_isa_probes("g++") as count:
    features = compiled_features("native", "g++")
    flags = cpu_vec_isa.pick_vec_isa().build_arch_flags()
print(json.dumps({"probes": probes, "runs": count.runs, "features": list(features), "flags": flags}))
"""


def test_the_vector_isa_probe_runs_once_per_machine(tmp_path):
    """Issue 25: Inductor compiles and runs a test program per vector ISA (12 s here, 40 s on the
    H100 host) in every build process. Each answer is kept in aotc's cache: a second process asks
    no compiler, picks the same flags, and records the same features."""
    env = {**os.environ, "AOTC_CACHE_DIR": str(tmp_path / "cache")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")  # no probe binaries kept there
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", PROBE_COUNT],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["probes"], "the first build process should run Inductor's probe"
    assert first["runs"] == len(first["probes"])
    assert second["probes"] == [] and second["runs"] == 0
    assert second["features"] == first["features"] and second["flags"] == first["flags"]
    remembered = list((tmp_path / "cache" / "cpu-isa").glob("*.json"))
    assert len(remembered) == first["runs"]  # one answer kept per probe
