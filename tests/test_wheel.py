"""aotc and aotc-runtime installed from their wheels, outside the checkout, export and build.

The mode presets (configs/) must travel inside the wheel: an installed aotc that looked for them
beside its source tree failed with "mode preset .../configs/modes/max-autotune.yaml is missing".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args, cwd, env=None, timeout=600):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{' '.join(map(str, args))}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    )
    return result


@pytest.mark.slow
def test_wheels_installed_outside_the_checkout_build_max_autotune(tmp_path):
    wheels, target, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    for project in (ROOT / "runtime", ROOT):
        _run(
            [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(project)],
            cwd=tmp_path,
        )
    _run(
        [
            *pip,
            "install",
            "--no-deps",
            "--target",
            str(target),
            *map(str, sorted(wheels.glob("*.whl"))),
        ],
        cwd=tmp_path,
    )
    # The installed copies come first on the path (before this checkout's editable install); the
    # dependencies (torch, click, yaml) come from this interpreter's site-packages.
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = _run(
        [
            sys.executable,
            "-c",
            "import aotc, aotc.config as c; print(aotc.__file__); print(c.CONFIGS_DIR)",
        ],
        cwd=work,
        env=env,
    )
    module_file, configs = where.stdout.split()
    assert module_file.startswith(str(target)) and configs == str(target / "aotc" / "configs")
    model = work / "mlp.py"
    model.write_text((ROOT / "examples" / "mlp.py").read_text())
    _run(
        [sys.executable, "-m", "aotc", "export", "mlp.py", "--input-shape", "4x128"],
        cwd=work,
        env=env,
    )
    built = _run(
        [
            sys.executable,
            "-m",
            "aotc",
            "build",
            "mlp.pt2",
            "--mode",
            "max-autotune",
            "--device",
            "cpu",
            "--quiet",
        ],
        cwd=work,
        env=env,
    )
    assert "run it: aotc run mlp_pkg/" in built.stdout
    _run([sys.executable, "-m", "aotc_runtime", "mlp_pkg"], cwd=work, env=env)
