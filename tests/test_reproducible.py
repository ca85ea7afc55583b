"""The same artifact, options and toolchain give the same package. The model files are
byte-identical; the manifest differs only in the fields that record the build as an event (when,
how long), which docs/package-format.md lists."""

from __future__ import annotations

import json

from conftest import MLP, invoke

from aotc.compiler.reproducible import last_commands_only

BUILD_EVENT_FIELDS = {"created", "build_seconds", "build_phases", "manifest_sha256"}


def test_building_twice_gives_the_same_package(tmp_path):
    artifact = tmp_path / "mlp.pt2"
    assert invoke("export", MLP, "--input-shape", "4x128", "-o", artifact).exit_code == 0
    folders = []
    for name in ("first", "second"):
        result = invoke("build", artifact, "--device", "cpu", "-o", tmp_path / name, "--quiet")
        assert result.exit_code == 0, result.stderr
        folders.append(tmp_path / name)
    first, second = folders
    assert (first / "model.pt2").read_bytes() == (second / "model.pt2").read_bytes()
    manifests = [json.loads((f / "manifest.json").read_text()) for f in folders]
    differ = {key for key in manifests[0] if manifests[0][key] != manifests[1].get(key)}
    assert differ <= BUILD_EVENT_FIELDS, differ
    assert (
        set(manifests[0]["varies_per_build"]["fields"]) == BUILD_EVENT_FIELDS
    )  # it says so itself
    assert manifests[0]["files"] == manifests[1]["files"]


def test_only_the_last_command_block_is_kept():
    source = "int f();\n"
    block = "\n// Compile cmd\n// g++ {}\n// Link cmd\n// g++ -shared\n"
    once = last_commands_only(source + block.format(1))
    assert last_commands_only(source + block.format(0) + block.format(1)) == once
    assert last_commands_only(source) == source
