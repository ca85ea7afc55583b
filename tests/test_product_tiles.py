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


KEY = (960, 576, "bfloat16", "norm")


def test_a_neighbour_replaces_the_rules_tile_only_when_clearly_faster():
    faster = (16, 512, 4)

    def seconds(key, tile):
        return {faster: 0.90e-6}.get(tile, 1.0e-6)

    table, record = pt.choose([KEY], lambda key: RULE, seconds)
    assert table == {KEY: faster}
    assert record == {"960x576 bfloat16 norm": {"tile": [16, 512, 4], "us": 0.9, "rule_us": 1.0}}
    assert_manifest_field("product_tiles", {"tuned_on": "NVIDIA H200", "tiles": record})

    def within_noise(key, tile):
        return {faster: 0.98e-6}.get(tile, 1.0e-6)

    table, record = pt.choose([KEY], lambda key: RULE, within_noise)
    assert table == {KEY: RULE} and record["960x576 bfloat16 norm"]["tile"] == list(RULE)


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
        assert 1 <= block_n <= n_out and 128 <= block_k <= max(rule[1], 2 * k_in)
        assert block_n * block_k <= 16384
        assert warps in (4, 8)


def test_a_one_byte_weight_may_hold_twice_the_elements_and_int4_tiles_their_bytes():
    """int8 and fp8 weights hold the same bytes in flight as a bf16 tile of half the elements;
    int4 tiles are bounded by their packed bytes and by the row's groups."""
    rule = (8, 2048, 8)
    int8 = pt.candidates_for((3072, 2048, "int8", "norm"), rule)
    assert max(n * k for n, k, _w in int8) == 2 * pt.ELEMENTS
    assert max(n * k for n, k, _w in pt.candidates_for((3072, 2048, "bfloat16", "norm"), rule)) == (
        pt.ELEMENTS
    )
    int4_rule = (8, 8, 8)
    int4 = pt.candidates_for((3072, 2048, "int4g128", "norm"), int4_rule)
    assert int4[0] == int4_rule and len(int4) == len(set(int4))
    for block_n, block_g, _warps in int4:
        assert block_n * block_g * 128 // 2 <= pt.INT4_TILE_BYTES and block_g <= 16
    assert (16, 8, 8) in int4 and (8, 16, 8) in int4  # twice either way, within the bytes
    assert pt.int4_group((3072, 2048, "int4g128", "norm")) == 128 and pt.int4_group(KEY) == 0


def test_tiles_are_in_force_only_inside_the_block():
    import torch

    with pt.tiles_in_force({KEY: (4, 512, 4)}):
        assert pt.tile_in_force(960, 576, torch.bfloat16, "norm") == (4, 512, 4)
        assert pt.tile_in_force(960, 576, torch.float32, "norm") is None  # the dtype is in the key
        assert pt.tile_in_force(960, 576, torch.bfloat16, "plain") is None  # and what it takes in
        with pt.tiles_in_force({}):
            assert pt.tile_in_force(960, 576, torch.bfloat16, "norm") is None
        assert pt.tile_in_force(960, 576, torch.bfloat16, "norm") == (4, 512, 4)
    assert pt.tile_in_force(960, 576, torch.bfloat16, "norm") is None
    assert pt.surroundings(True, False, True) == "norm+residual"
    assert pt.surroundings(False, False, False) == "plain"


TILES = {
    "tuned_on": "NVIDIA H100 80GB HBM3",
    "tiles": {"960x576 bfloat16 norm": {"tile": [8, 1024, 8], "us": 2.1, "rule_us": 2.1}},
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


@pytest.mark.parametrize("tuned_on", [7, None, ["NVIDIA H200"]])
def test_a_package_whose_tiles_name_no_gpu_is_refused_as_the_cpp_runner_refuses_it(
    packages, tmp_path, tuned_on
):
    """The runtimes read `tuned_on` for their note on another GPU: anything but text there is a
    manifest error naming the field, in Python as in C++ (runtime/cpp/src/manifest.cpp), and
    `aotc run` exits with the package error's code."""
    from conftest import invoke, tampered_copy

    import aotc_runtime
    from aotc_runtime.errors import PackageError

    tiles = dict(TILES, tuned_on=tuned_on)
    copy = tampered_copy(
        packages.get("mlp").package, tmp_path / "bad", edit=lambda m: m.update(product_tiles=tiles)
    )
    with pytest.raises(PackageError, match="product_tiles.tuned_on"):
        aotc_runtime.load(copy)
    result = invoke("run", copy)  # the package-error exit, one line naming the field
    assert result.exit_code == 7 and "product_tiles.tuned_on" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
