"""A CPU package records the instruction set it was compiled for, `--cpu-isa` builds a portable
one, and both runtimes refuse a CPU that lacks what a package needs."""

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
from aotc.compiler.cpu_isa import compiled_features
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
from aotc.compiler.cpu_isa import compiled_features, remembered_vec_isa_probes

probes = []
real = cpu_vec_isa.VecISA.check_build
cpu_vec_isa.VecISA.check_build = lambda self, code: probes.append(str(self)) or real(self, code)
with remembered_vec_isa_probes("g++", sys.argv[1]) as count:
    features = compiled_features("native", "g++")
    flags = cpu_vec_isa.pick_vec_isa().build_arch_flags()
print(json.dumps({"probes": probes, "runs": count.runs, "features": list(features), "flags": flags}))
"""


def probe_process(env: dict, device: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PROBE_COUNT, device],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def probe_result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_the_vector_isa_probe_runs_once_per_machine_and_never_for_cuda(tmp_path):
    """Inductor compiles and runs a test program per vector ISA (12 s here, 40 s on the H100 host)
    in every build process. Each answer is kept in aotc's cache: two builds starting together run
    each probe once between them, a later one asks no compiler, and all pick the same flags and
    record the same features. A CUDA build compiles no test program at all and picks the same
    flags."""
    env = {**os.environ, "AOTC_CACHE_DIR": str(tmp_path / "cache")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")  # no probe binaries kept there
    together = [probe_result(p) for p in [probe_process(env, "cpu") for _ in range(2)]]
    remembered = list((tmp_path / "cache" / "cpu-isa").glob("*.json"))
    assert remembered, "the first build processes should run Inductor's probe"
    # one answer kept per probe, and no probe ran in both processes
    assert sum(run["runs"] for run in together) == len(remembered)
    later = probe_result(probe_process(env, "cpu"))
    assert later["probes"] == [] and later["runs"] == 0
    cuda_env = {**env, "AOTC_CACHE_DIR": str(tmp_path / "cuda_cache")}
    cuda_env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "cuda_inductor")
    cuda = probe_result(probe_process(cuda_env, "cuda"))
    assert cuda["runs"] == 0 and not list((tmp_path / "cuda_inductor").rglob("*.so"))
    for run in [*together[1:], later, cuda]:
        assert run["features"] == together[0]["features"] and run["flags"] == together[0]["flags"]
