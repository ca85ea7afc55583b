"""A full disk during `aotc build` is one line and exit 2 naming the device,
never torch's native abort (exit 134), and leaves nothing behind. The real case mounts a 3 MiB
tmpfs (root only; skipped elsewhere)."""

from __future__ import annotations

import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
from conftest import invoke

ROOT = Path(__file__).resolve().parent.parent
WIDE = "import torch\n\n\ndef get_model():\n    return torch.nn.Linear(1024, 1024)\n"


@pytest.fixture(scope="module")
def wide_artifact(tmp_path_factory) -> Path:
    """A 4 MiB model: more than the small device below holds."""
    folder = tmp_path_factory.mktemp("wide")
    (folder / "wide.py").write_text(WIDE)
    result = invoke("export", folder / "wide.py", "--input-shape", "2x1024", "-o", folder / "w.pt2")
    assert result.exit_code == 0, result.stderr
    return folder / "w.pt2"


@pytest.fixture
def small_device(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root and the capability)")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_build_that_plainly_does_not_fit_is_refused_before_compiling(tmp_path, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr("shutil.disk_usage", lambda path: Usage(1 << 30, 1 << 30, 1 << 20))
    artifact = tmp_path / "a.pt2"
    assert (
        invoke(
            "export", ROOT / "examples" / "mlp.py", "--input-shape", "2x128", "-o", artifact
        ).exit_code
        == 0
    )
    result = invoke("build", artifact, "--device", "cpu", "-o", tmp_path / "pkg")
    assert result.exit_code == 2, result.stderr
    assert (
        result.stderr.startswith("error: no space left on the device holding")
        and "1 MiB free" in result.stderr
    )
    assert not (tmp_path / "pkg").exists()


def _build_in_a_child(artifact: Path, output: Path, preflight: bool) -> subprocess.CompletedProcess:
    # A child process: what the CLI does after a native failure (leave at once) must be its own exit.
    code = (
        "import aotc.compiler.backends.inductor as p\n"
        + ("" if preflight else "p.check_space = lambda *a: None\n")
        + "from aotc.cli.main import main\n"
        + f"main(['build', {str(artifact)!r}, '--device', 'cpu', '-o', {str(output)!r}])\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "preflight", [True, False], ids=["refused-first", "runs-out-while-writing"]
)
def test_a_full_disk_is_one_line_and_leaves_nothing(wide_artifact, small_device, preflight):
    result = _build_in_a_child(wide_artifact, small_device / "pkg", preflight)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: no space left on the device holding {small_device}"), last
    assert "terminate called" not in result.stderr and "Traceback" not in result.stderr
    assert list(small_device.iterdir()) == []


def test_places_on_one_device_need_their_sum_and_places_on_two_need_their_own(
    tmp_path, monkeypatch
):
    """The package folder and Inductor's cache each take a copy of the weights: on one device the
    check asks for both (an 8B model's 16 GB twice); on two, each for its own."""
    import aotc.compiler.disk_space as disk
    from aotc.errors import DiskFullError

    artifact = tmp_path / "a.pt2"
    with artifact.open("wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse
    places = [
        ("the package folder", tmp_path / "out"),
        ("Inductor's cache", tmp_path / "cache"),
        ("the temporary folder", tmp_path / "tmp"),
    ]
    monkeypatch.setattr(disk, "build_locations", lambda output: places)
    Usage = namedtuple("Usage", "total used free")
    free = (3 << 29) + disk.MARGIN_BYTES  # 1.5 GiB and the margin: one copy fits, two do not
    monkeypatch.setattr("shutil.disk_usage", lambda path: Usage(8 << 30, 0, free))
    monkeypatch.setattr(disk, "_device", lambda path: "one")
    with pytest.raises(DiskFullError) as refused:
        disk.check_space(tmp_path / "out" / "pkg", artifact)
    assert str(refused.value).startswith(
        f"no space left on the device holding {tmp_path / 'out'} (the package folder, Inductor's "
        f"cache, the temporary folder): {free >> 20} MiB free, the build needs about "
        f"{(2 << 30) + disk.MARGIN_BYTES >> 20} MiB there"
    ), refused.value
    monkeypatch.setattr(disk, "_device", lambda path: path.name)
    disk.check_space(tmp_path / "out" / "pkg", artifact)  # each device holds its one copy
