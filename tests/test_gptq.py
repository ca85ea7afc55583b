"""int4 levels chosen by GPTQ (`--quantize-method gptq`, aotc/export/gptq.py) against
round-to-nearest: the algorithm alone on known cases, and a package calibrated on the shipped text
whose logits on other text are closer to the float model's than round-to-nearest's package."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import invoke

import aotc_runtime
from aotc.export import gptq
from aotc.export import quantized_linear as ql

GROUP = 32


def rtn_levels(weight):
    scale, zero = ql.int4_grid(weight, GROUP, torch.bfloat16)
    return ql.int4_levels_on(weight, scale, zero), scale, zero


def dequantized(levels, scale, zero):
    n, k = levels.shape
    grouped = levels.float().reshape(n, k // GROUP, GROUP)
    return ((grouped - 8) * scale.float()[..., None] + zero.float()[..., None]).reshape(n, k)


def test_with_uncorrelated_activations_gptq_rounds_to_nearest():
    """H = c I: no feature's error can be made up by another, so GPTQ's levels are round-to-nearest
    on its grid, and its grid is the one chosen with every feature weighing the same."""
    torch.manual_seed(0)
    weight = torch.randn(48, 128)
    levels, scale, zero = gptq.gptq_levels(weight, 3.0 * torch.eye(128), GROUP, torch.bfloat16)
    want_scale, want_zero = ql.int4_grid_weighted(weight, GROUP, torch.bfloat16, torch.ones(128))
    assert torch.equal(scale, want_scale) and torch.equal(zero, want_zero)
    assert torch.equal(levels.float(), ql.int4_levels_on(weight, scale, zero))


def test_the_weighted_grid_lowers_the_weighted_error_and_keeps_the_range_where_it_is_best():
    """int4_grid_weighted: each group's error, weighted by its features' importance, is never
    above the min-to-max grid's (that grid is a candidate) and is lower overall on weights with
    outliers, where clipping the range pays; on a group of 16 evenly spaced values, which the
    min-to-max grid holds exactly, it keeps that grid."""
    torch.manual_seed(0)
    weight = torch.randn(64, 128)
    weight[:, ::37] *= 6  # an outlier in some groups
    importance = torch.rand(128) * 4

    def weighted_errors(scale, zero):
        error = (dequantized(ql.int4_levels_on(weight, scale, zero), scale, zero) - weight) ** 2
        return (error * importance).reshape(64, 128 // GROUP, GROUP).sum(-1)

    clipped = weighted_errors(*ql.int4_grid_weighted(weight, GROUP, torch.float32, importance))
    whole = weighted_errors(*ql.int4_grid(weight, GROUP, torch.float32))
    assert bool((clipped <= whole * (1 + 1e-5)).all())
    assert float(clipped.sum()) < 0.9 * float(whole.sum()), (clipped.sum(), whole.sum())
    even = torch.arange(16.0).repeat(2)[None, :] / 4 - 1  # one row, two groups of 16 levels
    scale, zero = ql.int4_grid_weighted(even, 16, torch.float32, torch.ones(32))
    assert torch.equal(scale, torch.full((1, 2), 0.25)) and torch.equal(
        zero, torch.full((1, 2), 1.0)
    )


def test_gptq_lowers_the_output_error_on_correlated_activations():
    """Activations with correlated features (as a model's are): on held-out rows of the same
    distribution, |X W_q^T - X W^T| is lower with GPTQ's levels than with RTN's."""
    torch.manual_seed(0)
    k = 128
    mixing = torch.randn(k, k) / k**0.5 + torch.eye(k)
    features = lambda rows: (torch.randn(rows, k) * torch.linspace(0.2, 3, k)) @ mixing  # noqa: E731
    calibration, held_out = features(2048), features(512)
    weight = torch.randn(64, k)
    chosen = gptq.gptq_levels(weight, calibration.t() @ calibration, GROUP, torch.bfloat16)
    assert chosen[0].dtype == torch.uint8 and int(chosen[0].max()) <= 15
    errors = {}
    for name, (levels, scale, zero) in {"gptq": chosen, "rtn": rtn_levels(weight)}.items():
        errors[name] = float((held_out @ (dequantized(levels, scale, zero) - weight).t()).norm())
    assert errors["gptq"] < 0.8 * errors["rtn"], errors


def test_gptq_keeps_the_grid_whose_levels_give_the_lower_output_error():
    """Of its two grids (min-to-max, and clipped by the activations), the layer keeps the one
    with the lower tr(E H E^T): never above GPTQ on either grid alone."""
    torch.manual_seed(1)
    k = 128
    features = (torch.randn(1024, k) * torch.linspace(0.1, 4, k)) @ (torch.eye(k) + 0.1)
    hessian = features.t() @ features
    weight = torch.randn(32, k)
    weight[:, ::29] *= 5  # outliers: clipping can pay in some groups

    def output_error(levels, scale, zero):
        error = weight.double() - dequantized(levels, scale, zero).double()
        return float(((error @ hessian.double()) * error).sum())

    kept = output_error(*gptq.gptq_levels(weight, hessian, GROUP, torch.bfloat16))
    prepared = gptq._prepared(hessian)
    for scale, zero in (
        ql.int4_grid(weight, GROUP, torch.bfloat16),
        ql.int4_grid_weighted(weight, GROUP, torch.bfloat16, torch.diag(hessian)),
    ):
        alone = output_error(gptq._levels(weight, prepared, scale, zero, GROUP), scale, zero)
        assert kept <= alone * (1 + 1e-9), (kept, alone)


def test_the_output_layer_is_calibrated_on_every_row_it_picks_from():
    """A step's output layer reads the rows it picks (`index`); its Hessian must come from all
    of them, not the one or two picked."""

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(32, 32)
            self.head = torch.nn.Linear(32, 16)

        def forward(self, x, picks):
            return self.head(self.inner(x)[picks])

    program = torch.export.export(Step(), (torch.randn(8, 32), torch.tensor([7]))).module()
    linears = [n.name for n in program.graph.nodes if n.target is torch.ops.aten.linear.default]
    sources = gptq.product_inputs(program, linears)
    nodes = {n.name: n for n in program.graph.nodes}
    assert nodes[sources[linears[1]]] is nodes[linears[0]]  # the inner product's whole output


def build_both(artifact, work, *flags) -> dict:
    """`artifact` built int4 (group 32) with round-to-nearest and with GPTQ: {method: package}."""
    built = {}
    for method in ("rtn", "gptq"):
        built[method] = work / method
        done = invoke("build", artifact, *flags, "--quantize", "int4-weight-only", "--group-size",
                      GROUP, "--quantize-method", method, "-o", built[method], "--quiet")  # fmt: skip
        assert done.exit_code == 0, done.stderr
    return built


def held_out_errors(built: dict, generation_packages, device: str = "cpu") -> dict:
    """Three sections of the Python Language Reference (not the calibration text): {method: the
    mean relative error of the package's logits at every 16th position against eager fp32}."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer

    _package, model = generation_packages.with_json_tokenizer()
    folder = generation_packages.root.parent / "json_tokenizer"
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    loaded = {method: aotc_runtime.load(package) for method, package in built.items()}
    errors: dict = {method: [] for method in built}
    for topic in ("assignment", "class", "if"):
        ids = torch.tensor(tokenizer.encode(topics[topic]).ids[:256])
        with torch.no_grad():
            want = model(ids[None]).logits[0]
        t = len(ids)
        for position in range(15, t, 16):
            call = {"input_ids": ids, "rows": torch.zeros(t, dtype=torch.int64),
                    "positions": torch.arange(t), "picks": torch.tensor([position, position])}  # fmt: skip
            call = {name: tensor.to(device) for name, tensor in call.items()}
            for method, package in loaded.items():
                got = package(**call)[0].float().cpu()
                errors[method].append(float((got - want[position]).norm() / want[position].norm()))
    return {method: sum(values) / len(values) for method, values in errors.items()}


@pytest.fixture(scope="module")
def calibrated(generation_packages, tmp_path_factory):
    """The json-tokenizer Llama's artifact built on the CPU both ways: {method: package}."""
    generation_packages.with_json_tokenizer()
    artifact = generation_packages.root / "llama_json.pt2"
    return build_both(artifact, tmp_path_factory.mktemp("gptq"), "--device", "cpu")


def test_a_gptq_package_records_its_calibration_and_passes_the_check(calibrated):
    record = json.loads((calibrated["gptq"] / "manifest.json").read_text())
    assert record["numeric_check"]["passed"]
    quantization = record["quantization"]
    assert quantization["method"] == "gptq"
    assert quantization["calibration"]["tokens"] == gptq.CALIBRATION_TOKENS
    plain = json.loads((calibrated["rtn"] / "manifest.json").read_text())["quantization"]
    assert plain["method"] == "rtn" and "calibration" not in plain
    assert [layer["name"] for layer in quantization["layers"]] == [
        layer["name"] for layer in plain["layers"]
    ]
    # its 300-word output layer is one torch's CPU int4 kernel cannot take: kept, not a crash
    [kept] = quantization["kept"]
    assert kept["name"].endswith("lm_head") and "divisible by 16" in kept["why"], kept
    # `aotc verify` chooses the levels again from the artifact and the shipped text: its reference
    # is the build's, to the bit (a round-to-nearest one would be passed by the loose bound, far off)
    verified = invoke("verify", calibrated["gptq"], "--json")
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    [output] = json.loads(verified.stdout)["numeric_check"]["outputs"]
    assert output["max_abs"] <= output["recorded_max_abs"] * 1.01 + 1e-6, output


def test_gptq_logits_on_text_it_never_saw_are_closer_to_the_float_models(
    calibrated, generation_packages
):
    mean = held_out_errors(calibrated, generation_packages)
    assert mean["gptq"] < 0.85 * mean["rtn"], mean


@pytest.mark.gpu
def test_on_cuda_gptq_levels_run_through_tinygemm_closer_to_the_float_model(
    generation_packages, tmp_path
):
    """The same builds for CUDA in bf16 (tinygemm's tiles hold GPTQ's levels): both pass their
    check, and GPTQ's logits on unseen text are the closer ones."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    generation_packages.with_json_tokenizer()
    artifact = generation_packages.root / "llama_json.pt2"
    flags = ("--device", "cuda", "--precision", "bf16", "--mode", "reduce-overhead")
    built = build_both(artifact, tmp_path, *flags)
    for package in built.values():
        assert json.loads((package / "manifest.json").read_text())["numeric_check"]["passed"]
    mean = held_out_errors(built, generation_packages, device="cuda")
    assert mean["gptq"] < 0.85 * mean["rtn"], mean
