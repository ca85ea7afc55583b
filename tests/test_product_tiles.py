"""The fused products' tiles a CUDA build chooses by timing them on its GPU
(aotc/kernels/product_tiles.py), without a GPU: the choice against a stand-in timer, the candidates'
bounds, the manifest's record, and what the runtime says on another GPU. The candidates' kernels are
lowered by tests/test_kernel_frontend.py (make test-kernels); the timing runs in
tests/test_gpu_generate.py."""

from __future__ import annotations

import dataclasses

import pytest

from aotc.kernels import product_tiles as pt

RULE = (8, 1024, 8)


def assert_manifest_field(name: str, value) -> None:
    """`value` is what docs/manifest.schema.json says the manifest's `name` holds."""
    import json

    import jsonschema
    from conftest import MANIFEST_SCHEMA

    schema = json.loads(MANIFEST_SCHEMA.read_text())
    jsonschema.validate(value, schema["properties"][name])


KEY = (960, 576, "bfloat16")


def test_a_neighbour_replaces_the_rules_tile_only_when_clearly_faster():
    faster = (16, 512, 4)

    def seconds(key, tile):
        return {faster: 0.90e-6}.get(tile, 1.0e-6)

    table, record = pt.choose([KEY], lambda key: RULE, seconds)
    assert table == {KEY: faster}
    assert record == {"960x576 bfloat16": {"tile": [16, 512, 4], "us": 0.9, "rule_us": 1.0}}
    assert_manifest_field("product_tiles", {"tuned_on": "NVIDIA H200", "tiles": record})

    def within_noise(key, tile):
        return {faster: 0.98e-6}.get(tile, 1.0e-6)

    table, record = pt.choose([KEY], lambda key: RULE, within_noise)
    assert table == {KEY: RULE} and record["960x576 bfloat16"]["tile"] == list(RULE)


def test_a_neighbour_that_fails_is_no_candidate_but_the_rules_tile_failing_fails():
    broken = pt.candidates(960, 576, RULE)[1]

    def seconds(key, tile):
        if tile == broken:
            raise RuntimeError("out of resources")
        return 1.0e-6

    table, _record = pt.choose([KEY], lambda key: RULE, seconds)
    assert table == {KEY: RULE}

    def rule_fails(key, tile):
        raise RuntimeError("out of resources")

    with pytest.raises(RuntimeError, match="out of resources"):
        pt.choose([KEY], lambda key: RULE, rule_fails)


def test_every_candidate_is_timed_once_and_the_rules_tile_first():
    timed = []
    pt.choose([KEY], lambda key: RULE, lambda key, tile: timed.append(tile) or 1.0)
    assert timed[0] == RULE and len(timed) == len(set(timed)) == len(pt.candidates(960, 576, RULE))


@pytest.mark.parametrize(
    ("n_out", "k_in", "rule"),
    [(960, 576, (8, 1024, 8)), (3, 64, (1, 64, 4)), (49152, 576, (16, 1024, 8))],
)
def test_candidates_keep_the_kernels_register_bound(n_out, k_in, rule):
    found = pt.candidates(n_out, k_in, rule)
    assert found[0] == rule and len(found) == len(set(found))
    for block_n, block_k, warps in found[1:]:
        assert 1 <= block_n <= n_out and block_k >= 128 and block_n * block_k <= 16384
        assert warps in (4, 8)


def test_tiles_are_in_force_only_inside_the_block():
    import torch

    with pt.tiles_in_force({KEY: (4, 512, 4)}):
        assert pt.tile_in_force(960, 576, torch.bfloat16) == (4, 512, 4)
        assert pt.tile_in_force(960, 576, torch.float32) is None  # the dtype is part of the key
        with pt.tiles_in_force({}):
            assert pt.tile_in_force(960, 576, torch.bfloat16) is None
        assert pt.tile_in_force(960, 576, torch.bfloat16) == (4, 512, 4)
    assert pt.tile_in_force(960, 576, torch.bfloat16) is None


TILES = {
    "tuned_on": "NVIDIA H100 80GB HBM3",
    "tiles": {"960x576 bfloat16": {"tile": [8, 1024, 8], "us": 2.1, "rule_us": 2.1}},
}


def test_the_record_travels_in_the_manifest_and_another_gpu_is_named_once(packages, tmp_path):
    from conftest import tampered_copy

    import aotc_runtime
    from aotc_runtime.environment import tuned_elsewhere

    source = packages.get("mlp").package
    copy = tampered_copy(source, tmp_path / "tiled", edit=lambda m: m.update(product_tiles=TILES))
    manifest = aotc_runtime.load(copy).manifest
    assert manifest.product_tiles == TILES
    note = tuned_elsewhere(manifest, "NVIDIA H200")
    assert note is not None and "NVIDIA H100 80GB HBM3" in note and "NVIDIA H200" in note
    assert "runs correctly" in note and "\n" not in note
    assert tuned_elsewhere(manifest, "NVIDIA H100 80GB HBM3") is None
    assert tuned_elsewhere(dataclasses.replace(manifest, product_tiles={}), "NVIDIA H200") is None
