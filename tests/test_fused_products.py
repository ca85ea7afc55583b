"""The pass that fuses a decode step's products with their norm, activation and residual add
(aotc/export/fused_products.py), on the CPU: the program it leaves computes exactly what the
unfused one does (on the CPU a fused node is `reference`, the unfused computation), and it fuses
what each family writes and nothing else. The kernel itself is held to `reference` on the GPU by
tests/test_gpu_fused_products.py."""

from __future__ import annotations

import copy

import pytest
import torch

from aotc.config import Precision
from aotc.export.artifact import load_artifact
from aotc.export.fused_products import Fusions, fuse_products, fused_linear, reference
from aotc.export.placement import place_program

LAYERS = 2  # the zoo's language models


def unlifted(family: str, generation_packages):
    ep, meta = load_artifact(generation_packages.artifact(family))
    inputs = len(meta.signature["inputs"])
    return ep, meta, ep.module(), list(ep.example_inputs[0]), inputs


@pytest.mark.parametrize(
    "family, expected, products",
    [
        # Llama's layers: the norm into q/k/v and into gate/up, silu(gate) * up into down, the
        # residual after o and after down: each layer's four products fused; and the final norm
        # into the output layer, which reads the rows the step picks from it
        ("llama", Fusions(norm=2 * LAYERS + 1, gated=LAYERS, residual=2 * LAYERS), 4 * LAYERS + 1),
        ("qwen2", Fusions(norm=2 * LAYERS + 1, gated=LAYERS, residual=2 * LAYERS), 4 * LAYERS + 1),
        ("qwen3", Fusions(norm=2 * LAYERS + 1, gated=LAYERS, residual=2 * LAYERS), 4 * LAYERS + 1),
        # Gemma 2 scales by (1 + weight), uses gelu, and norms a product's output before the
        # residual: nothing there is the pattern
        ("gemma2", Fusions(), 0),
    ],
)
def test_the_fused_program_computes_what_the_unfused_one_does(
    family, expected, products, generation_packages
):
    """Qwen 2's q/k/v have a bias (the epilogue adds it); Qwen 3 norms q and k per head, norms
    whose output feeds no product, which stay as they are."""
    _ep, _meta, module, example, _inputs = unlifted(family, generation_packages)
    before = module(*copy.deepcopy(example))
    fused = copy.deepcopy(module)
    assert fuse_products(fused) == expected
    after = fused(*copy.deepcopy(example))
    for ours, theirs in zip(after, before):
        assert torch.equal(ours, theirs)
    linear = torch.ops.aten.linear.default
    assert sum(n.target is fused_linear for n in fused.graph.nodes) == products
    assert (
        sum(n.target is linear for n in fused.graph.nodes)
        == sum(n.target is linear for n in module.graph.nodes) - products
    )


def test_gpt2s_conv1d_products_take_their_layer_norm_gelu_and_residual(generation_packages):
    """GPT-2's products are `Conv1D`s, addmm over input-major weights between views: each becomes
    a linear over its weight transposed once, then takes its LayerNorm (with a bias), gelu_new or
    residual add (past the eval dropout before it) in; the final LayerNorm goes into the output
    layer through a view that keeps its shape. The fused program computes what the unfused one
    does."""
    _ep, _meta, module, example, _inputs = unlifted("gpt2", generation_packages)
    before = module(*copy.deepcopy(example))
    fused = copy.deepcopy(module)
    assert fuse_products(fused) == Fusions(norm=2 * LAYERS + 1, residual=2 * LAYERS, gelu=LAYERS)
    after = fused(*copy.deepcopy(example))
    for ours, theirs in zip(after, before):
        assert torch.equal(ours, theirs)
    nodes = list(fused.graph.nodes)
    assert not any(
        n.target in (torch.ops.aten.addmm.default, torch.ops.aten.linear.default) for n in nodes
    )
    products = [n for n in nodes if n.target is fused_linear]
    assert len(products) == 4 * LAYERS + 1
    for node in products:  # each weight stored output-major, as the kernel reads it
        weight = fused.get_parameter(node.args[1].target)
        assert weight.shape[0] == node.meta["val"].shape[-1]


def test_reference_is_transformers_gelu_new_and_layer_norm():
    from transformers.activations import NewGELUActivation

    from aotc.export.fused_products import gelu_new

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g) * 4
    assert torch.equal(gelu_new(x), NewGELUActivation()(x))
    weight, w, b = (
        torch.randn(8, 64, generator=g),
        torch.randn(64, generator=g),
        torch.randn(64, generator=g),
    )
    got = reference(x, weight, None, w, None, 1e-5, False, 0.0, norm_bias=b, layer_norm=True)
    want = torch.nn.functional.linear(torch.nn.functional.layer_norm(x, (64,), w, b, 1e-5), weight)
    assert torch.equal(got, want)
    got = reference(x, weight, None, None, None, 0.0, False, 0.0, gelu=True)
    assert torch.equal(got, torch.nn.functional.linear(NewGELUActivation()(x), weight))


def test_a_bf16_build_fuses_the_same_products_through_its_casts(generation_packages):
    """In bf16 each product's input is clamped and cast first (reduced_precision.py): the fused
    nodes take that in, and the program re-exports."""
    ep, meta, *_ = unlifted("llama", generation_packages)
    fusions = Fusions()
    place_program(ep, "cpu", Precision.BF16, meta.signature, fusions=fusions)
    assert fusions == Fusions(norm=2 * LAYERS + 1, gated=LAYERS, residual=2 * LAYERS)


@pytest.mark.parametrize(
    "family, expected",
    [
        ("llama", Fusions(norm=2 * LAYERS + 1, gated=LAYERS, residual=2 * LAYERS)),
        ("gpt2", Fusions(norm=2 * LAYERS + 1, residual=2 * LAYERS, gelu=LAYERS)),
    ],
)
def test_a_program_exported_in_bf16_fuses_the_same_products_and_computes_the_same(
    family, expected, generation_packages, tmp_path
):
    """A model exported in bf16 (`aotc export --dtype bfloat16`, or a folder whose config says
    bf16) writes its RMSNorm as transformers runs it in that dtype: the scaled row cast back to
    bf16 before the weight multiplies it, and each product's input cast to bf16 with nothing to
    clamp. The fused program takes both in, and computes exactly what the unfused one does. Its
    residual stream stays in bf16: each RMSNorm's cast of it to fp32 is the kernel's (the
    unfused program keeps one for every norm; a standalone cast kernel each on the GPU)."""
    from conftest import GENERATION_BATCH, GENERATION_MAX_LEN, invoke

    artifact = tmp_path / f"{family}_bf16.pt2"
    done = invoke(
        "export", generation_packages.model_file(family), "--task", "text-generation",
        "--max-seq-len", GENERATION_MAX_LEN, "--batch-size", GENERATION_BATCH,
        "--dtype", "bfloat16", "-o", artifact,
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    ep, meta = load_artifact(artifact)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, value in ep.state_dict.items():  # the zoo's norms are all ones (times 4), a
            if "norm" in name:  # power of two, which hides a rounding; other weights show it
                value.copy_(1 + 0.5 * torch.randn(value.shape, generator=generator))
    fusions = Fusions()
    fused = place_program(ep, "cpu", Precision.BF16, meta.signature, fusions=fusions)
    assert fusions == expected
    plain = place_program(ep, "cpu", Precision.BF16, meta.signature)
    if family == "llama":  # GPT-2's LayerNorm takes its input in bf16: no cast to take in
        # the norms' casts, before the pass and after it (the CPU's program computes them again
        # in `reference`; on the GPU the kernel loads the bf16 stream as fp32)
        inner = copy.deepcopy(ep.module())
        assert len(half_upcasts(inner)) == 2 * LAYERS + 1
        fuse_products(inner)
        assert half_upcasts(inner) == []
    example = list(ep.example_inputs[0])
    for ours, theirs in zip(
        fused.module()(*copy.deepcopy(example)), plain.module()(*copy.deepcopy(example))
    ):
        assert torch.equal(ours, theirs)


def half_upcasts(module) -> list:
    """The nodes of a graph module that cast a bf16 or fp16 value to fp32."""
    casts = (torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default)
    found = []
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target not in casts:
            continue
        source = node.args[0].meta.get("val")
        out = node.meta.get("val")
        if getattr(out, "dtype", None) is torch.float32 and getattr(source, "dtype", None) in (
            torch.bfloat16, torch.float16,
        ):  # fmt: skip
            found.append(node)
    return found


def quantized_program(generation_packages, low, scheme="int8-weight-only", group=None):
    """The zoo Llama's unlifted program in `low`, its linears quantized for CUDA as a build with
    --fused-products does (placement.place_program's steps), on the CPU."""
    from aotc.export import quantization
    from aotc.export.placement import (
        cast_weight_matmul_operands,
        clamp_float_extremes,
        drop_dtype_assertions,
    )
    from aotc.quantize_schemes import Quantization

    ep, meta, module, example, inputs = unlifted("llama", generation_packages)
    module = copy.deepcopy(module).to(dtype=low)
    if low is torch.bfloat16:
        drop_dtype_assertions(module)
        cast_weight_matmul_operands(module, low)
        clamp_float_extremes(module, low)
    quantization.quantize_graph(
        module, Quantization(scheme, group), "cuda", low, {}, groups_product=True
    )
    return module, example[:inputs] + [t.to(low) for t in example[inputs:]]


@pytest.mark.parametrize("scheme", ["int8-weight-only", "fp8"])
def test_int8_and_fp8_products_are_fused_and_compute_what_the_unfused_ones_do(
    generation_packages, monkeypatch, scheme
):
    """int8-weight-only and fp8 products (quantization.py's cuda_int8_linear and fp8_linear)
    take their neighbours in as float ones do, in fp32 and through a bf16 build's casts. On the
    CPU each product is the fp32 sums of its stored weights, scaled per row (int8) or per block
    (fp8), which the unfused program computes too (its CUDA kernels stood in for)."""
    import sys
    import types

    from aotc.export import quantization
    from aotc.export import quantized_linear as ql

    def int8_sums(x, q, scale):
        return (x.float() @ q.float().T * scale.float()).to(x.dtype)

    def fp8_sums(x, q, scale):
        return (x.float() @ ql.fp8_blocks_dequantized(q, scale).T).to(x.dtype)

    monkeypatch.setattr(quantization, "_gemv", int8_sums)
    monkeypatch.setitem(
        sys.modules, "aotc.kernels.gemv", types.SimpleNamespace(blocks_gemv=fp8_sums)
    )
    product = (
        quantization.cuda_int8_linear if scheme == "int8-weight-only" else quantization.fp8_linear
    )
    # the output layer takes the final norm in too, quantized or kept in the base precision
    expected = Fusions(norm=2 * LAYERS + 1, gated=LAYERS, residual=2 * LAYERS)
    module, example = quantized_program(generation_packages, torch.float32, scheme)
    fused = copy.deepcopy(module)
    assert fuse_products(fused) == expected
    for ours, theirs in zip(fused(*copy.deepcopy(example)), module(*copy.deepcopy(example))):
        assert torch.equal(ours, theirs)
    # every product fused, the output layer's too
    assert not [n for n in fused.graph.nodes if n.target is product]
    module, _ = quantized_program(generation_packages, torch.bfloat16, scheme)
    assert fuse_products(module) == expected
    operands = {
        n.args[9] for n in module.graph.nodes if n.target is fused_linear and len(n.args) > 9
    }  # the quantized products (fp8 keeps its output layer in the base precision)
    assert operands == {torch.bfloat16}  # the dtype the build casts the activations to


def test_int4_groups_products_are_fused_and_compute_what_the_unfused_ones_do(
    generation_packages,
):
    """With fused products a CUDA int4 build stores aotc's int4 groups (not tinygemm's tiles),
    multiplied by aotc's kernel; the pass takes their neighbours in. On the CPU both programs
    multiply the dequantized groups."""
    from aotc.export import quantization

    expected = Fusions(norm=2 * LAYERS + 1, gated=LAYERS, residual=2 * LAYERS)
    module, example = quantized_program(
        generation_packages, torch.float32, "int4-weight-only", group=32
    )
    stored = {name for name, _ in module.named_buffers()}
    assert any(name.endswith("packed") for name in stored)
    assert not any("tiles" in name for name in stored)
    fused = copy.deepcopy(module)
    assert fuse_products(fused) == expected
    for ours, theirs in zip(fused(*copy.deepcopy(example)), module(*copy.deepcopy(example))):
        assert torch.equal(ours, theirs)
    # every product fused, the output layer's (with the final norm) too
    assert not [n for n in fused.graph.nodes if n.target is quantization.cuda_int4_groups_linear]
    assert {n.args[-1] for n in fused.graph.nodes if n.target is fused_linear} == {32}


def test_a_product_not_in_the_pattern_is_left_alone():
    """A norm whose output has another user, and a product whose add scales it, are not fused."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)
            self.proj = torch.nn.Linear(8, 8, bias=False)

        def forward(self, x):
            x32 = x.to(torch.float32)
            normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
            scaled = self.weight * normed.to(torch.float32)
            return self.proj(scaled), scaled.sum(), torch.add(x, self.proj(x), alpha=2.0)

    x = torch.randn(3, 8)
    module = torch.export.export(Block(), (x,)).module()
    fused = copy.deepcopy(module)
    assert fuse_products(fused) == Fusions()
    for ours, theirs in zip(fused(x), module(x)):
        assert torch.equal(ours, theirs)


def test_rows_picked_between_the_norm_and_the_product_are_picked_first():
    """The output layer's pattern (the final norm, the rows a step returns picked, the product):
    the pass picks the rows of the norm's input and fuses the norm, which computes the same. A
    pick of features (the last dimension) is not a row pick, and stays as it is."""

    class Head(torch.nn.Module):
        def __init__(self, features: bool):
            super().__init__()
            self.features = features
            self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)
            self.proj = torch.nn.Linear(8, 5, bias=False)

        def forward(self, x, picks):
            x32 = x.to(torch.float32)
            normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
            scaled = self.weight * normed.to(torch.float32)
            return self.proj(scaled[..., picks] if self.features else scaled[:, picks])

    x = torch.randn(1, 6, 8)
    for features, picks, expected in (
        (False, torch.tensor([5, 2]), Fusions(norm=1)),
        (True, torch.randperm(8), Fusions()),
    ):
        module = torch.export.export(Head(features), (x, picks)).module()
        fused = copy.deepcopy(module)
        assert fuse_products(fused) == expected
        assert torch.equal(fused(x, picks), module(x, picks))
        picks_rows = [n for n in fused.graph.nodes if n.target is torch.ops.aten.index.Tensor]
        assert len(picks_rows) == 1


def test_reference_is_transformers_rmsnorm_and_the_gated_mlp():
    """`reference` against the computation written out: Llama's RMSNorm times its weight into a
    linear with a residual; silu(gate) * up into a linear."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(16, eps=1e-5)
    norm.weight.data = torch.rand(16) + 0.5
    linear = torch.nn.Linear(16, 24, bias=True)
    x, residual = torch.randn(5, 16), torch.randn(5, 24)
    expected = residual + linear(norm(x))
    got = reference(x, linear.weight, linear.bias, norm.weight, residual, 1e-5, False, 0.0)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    gate_up = torch.randn(5, 32)
    down = torch.nn.Linear(16, 24, bias=False)
    expected = down(torch.nn.functional.silu(gate_up[:, :16]) * gate_up[:, 16:])
    torch.testing.assert_close(
        reference(gate_up, down.weight, None, None, None, 0.0, True, 0.0), expected
    )


def test_a_fused_build_for_more_rows_than_the_kernels_take_says_what_decode_costs():
    """A package that replays its decode as a CUDA graph feeds all its rows each step: above the
    fused kernels' rows they would never run, so the build leaves the fusion out, with one note
    naming the export flag. Without the graph a step feeds the rows in use: an int4 build warns
    that more rows dequantize every weight each step, a float one notes that they run the
    unfused products. A build within the rows fuses and says nothing."""
    import io

    from aotc.compiler.backends.inductor import fused_products_reach_decode
    from aotc.kernels.product_tiles import MAX_ROWS
    from aotc.progress import Progress

    said, fused = {}, {}
    for batch in (MAX_ROWS, MAX_ROWS * 2):
        for int4 in (True, False):
            for graphs in (True, False):
                said[batch, int4, graphs] = io.StringIO()
                progress = Progress(stream=said[batch, int4, graphs])
                fused[batch, int4, graphs] = fused_products_reach_decode(
                    batch, graphs, int4, progress
                )
    for int4 in (True, False):
        for graphs in (True, False):
            assert fused[MAX_ROWS, int4, graphs] and said[MAX_ROWS, int4, graphs].getvalue() == ""
    for int4 in (True, False):  # a graph of more rows: left out, one note
        assert fused[MAX_ROWS * 2, int4, True] is False
        lines = said[MAX_ROWS * 2, int4, True].getvalue().splitlines()
        assert len(lines) == 1 and not lines[0].startswith("warning: "), lines
        assert f"CUDA graph of all {MAX_ROWS * 2} rows" in lines[0]
        assert f"export with --batch-size {MAX_ROWS} or less" in lines[0]
    assert fused[MAX_ROWS * 2, True, False] and fused[MAX_ROWS * 2, False, False]
    lines = said[MAX_ROWS * 2, True, False].getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ")
    assert f"a decode of more (up to {MAX_ROWS * 2}) dequantizes every weight" in lines[0]
    assert "without --fused-products" in lines[0]
    lines = said[MAX_ROWS * 2, False, False].getvalue().splitlines()
    assert len(lines) == 1 and not lines[0].startswith("warning: ")
    wanted = f"up to {MAX_ROWS} rows; a decode of more (up to {MAX_ROWS * 2}) runs the unfused"
    assert wanted in lines[0], lines
