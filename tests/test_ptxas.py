"""The build process gets the ptxas Inductor's compile workers use (aotc/compiler/ptxas.py)."""

import os
from pathlib import Path

import pytest

from aotc.compiler import ptxas


@pytest.fixture
def workers_choose(monkeypatch, tmp_path):
    """Make torch's worker hook choose a fake ptxas, as torch 2.11+cu130 chooses torch/bin/ptxas."""
    from torch._inductor.runtime import compile_tasks

    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)

    def choose():
        if os.environ.get(ptxas.ENV) is None:
            os.environ[ptxas.ENV] = str(fake)

    monkeypatch.setattr(compile_tasks, "_set_triton_ptxas_path", choose)
    monkeypatch.delenv(ptxas.ENV, raising=False)
    return str(fake)


def test_build_process_uses_the_workers_ptxas_and_restores_the_environment(workers_choose):
    assert ptxas.workers_ptxas() == workers_choose
    assert ptxas.ENV not in os.environ  # asking does not leave it set
    with ptxas.same_ptxas_as_workers() as path:
        assert path == workers_choose
        assert os.environ[ptxas.ENV] == workers_choose
    assert ptxas.ENV not in os.environ


def test_a_ptxas_the_user_chose_wins(workers_choose, monkeypatch):
    monkeypatch.setenv(ptxas.ENV, "/opt/cuda/bin/ptxas")
    with ptxas.same_ptxas_as_workers() as path:
        assert path == "/opt/cuda/bin/ptxas" == os.environ[ptxas.ENV]
    assert os.environ[ptxas.ENV] == "/opt/cuda/bin/ptxas"


def test_cpu_builds_leave_the_environment_alone(workers_choose):
    with ptxas.same_ptxas_as_workers(enabled=False) as path:
        assert path is None and ptxas.ENV not in os.environ


def test_no_bundled_ptxas_means_triton_keeps_its_own(monkeypatch):
    # the real hook of the installed torch (2.13 CPU: no bundled ptxas) leaves the variable unset
    import torch._inductor.runtime.compile_tasks as tasks

    monkeypatch.delenv(ptxas.ENV, raising=False)
    if any((p / "bin" / "ptxas").exists() for p in Path(tasks.__file__).absolute().parents[:3]):
        pytest.skip("this torch bundles a ptxas")
    assert ptxas.workers_ptxas() is None and ptxas.ENV not in os.environ
