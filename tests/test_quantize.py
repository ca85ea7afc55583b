"""`aotc build --quantize` on the CPU: int8 and int4 weight-only on the zoo's Llama exported for
generation (batch 2, so decode runs the few-rows product and a prompt the dense one), int8 dynamic
on the zoo's BERT, the C++ runner on a quantized package, and the refusals.

A weight-only package means the float model with each weight replaced by its dequantized self:
its tokens are compared with transformers' `generate` on exactly that model (fp32, token for
token), and with the unquantized package within the agreement docs/quantization.md states.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import assert_manifest_matches_schema, invoke, load_model_file
from test_cpp_runner import GENERATE_PROMPTS, python_generate, run_cpp
from test_generate import prompts, reference

import aotc_runtime
from aotc.export import quantized_linear as ql

NEW = 12
# How far the quantized tokens may part from the unquantized model's is not asserted here: this
# random LM's sharpened logits (weights x4) flip under int4's error at the first token, and under
# int8's once the CPU kernels round activations to bf16 (0.46 of tokens agreed, where fp32
# activations gave 0.9 or more), which says nothing of a trained model's. Agreement is measured on
# SmolLM2 instead (docs/quantization.md); here the package must equal transformers token for token
# on exactly the weights and roundings it computes with.


def dequantize_linears(model, scheme: str, group_size: int = 128) -> None:
    """Replace every nn.Linear's weight (and a tied embedding's) by what `scheme` stores of it,
    dequantized: the model a weight-only CPU package computes. The CPU's int4 and int8 kernels
    take their scales in bf16, and bf16 activations into a bf16 product: its linears round so
    too, but for int8's output layer, which keeps the activations' fp32."""
    output = model.get_output_embeddings() if scheme == "int8-weight-only" else None
    with torch.no_grad():
        for module in linears_in_bf16(model, keep=output):
            w = module.weight.float()
            if scheme == "int8-weight-only":
                back = ql.int8_rows_dequantized(*ql.int8_rows(w, torch.bfloat16))
            else:
                back = ql.int4_groups_dequantized(
                    *ql.int4_groups(w, group_size, torch.bfloat16), group_size
                )
            module.weight.copy_(back.to(module.weight.dtype))


def linears_in_bf16(model, keep=None) -> list:
    """The model's nn.Linear layers, each but `keep` now rounding its input and output to bf16 as
    the CPU's quantized kernels do."""

    def to_bf16(tensor):
        return tensor.to(torch.bfloat16).to(tensor.dtype)

    found = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    for module in found:
        if module is keep:
            continue
        module.register_forward_pre_hook(lambda _m, args: (to_bf16(args[0]),))
        module.register_forward_hook(lambda _m, _args, out: to_bf16(out))
    return found


def weights_bytes(package: Path) -> int:
    """Bytes of the weights AOTInductor stored in the package's model.pt2."""
    with zipfile.ZipFile(package / "model.pt2") as archive:
        return sum(i.file_size for i in archive.infolist() if i.filename.endswith("_weights.blob"))


@pytest.fixture(scope="module")
def llama(generation_packages, tmp_path_factory):
    """(artifact, model file, unquantized package, {scheme: package}), built on first use."""
    package, _model = generation_packages["llama"]
    artifact = package.parent / "llama.pt2"
    source = package.parent / "llama_lm.py"
    work = tmp_path_factory.mktemp("quantize")
    built: dict = {}

    def get(scheme: str) -> Path:
        if scheme not in built:
            out = work / f"{scheme}_pkg"
            group = ["--group-size", "32"] if scheme == "int4-weight-only" else []
            done = invoke("build", artifact, "--device", "cpu", "--quantize", scheme, *group,
                          "-o", out, "--quiet")  # fmt: skip
            assert done.exit_code == 0, done.stderr
            built[scheme] = out
        return built[scheme]

    return artifact, source, package, get


@pytest.mark.parametrize("scheme", ["int8-weight-only", "int4-weight-only"])
def test_weight_only_tokens_equal_transformers_on_the_dequantized_weights(llama, scheme):
    _artifact, source, _base, get = llama
    model = load_model_file(source)
    dequantize_linears(model, scheme, group_size=32)
    ids, mask = prompts()
    expected = reference(model, ids, mask, NEW, min_new_tokens=NEW, pad_token_id=0)
    package = aotc_runtime.load(get(scheme))
    got = package.generate(ids, mask, max_new_tokens=NEW, eos_token_ids=[])
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("scheme", ["int8-weight-only", "int4-weight-only"])
def test_manifest_records_the_scheme_and_the_package_stores_it(llama, scheme):
    _artifact, _source, base, get = llama
    package = get(scheme)
    manifest = json.loads((package / "manifest.json").read_text())
    assert_manifest_matches_schema(package)
    record = manifest["quantization"]
    assert record["scheme"] == scheme
    assert record["group_size"] == (32 if scheme == "int4-weight-only" else None)
    assert len(record["layers"]) == 9 and record["kept"] == []
    assert all(layer["error"] <= record["error_bound"] for layer in record["layers"])
    # against fp32: the linears at 1/4 and about 1/6, the (unquantized, untied) embedding a fifth
    # of the weights: int8 0.42, int4 g32 0.37
    ratio = weights_bytes(package) / weights_bytes(base)
    assert ratio < {"int8-weight-only": 0.45, "int4-weight-only": 0.4}[scheme], ratio


def test_quantize_skip_keeps_the_named_layers(llama):
    artifact, _source, _base, _get = llama
    out = artifact.parent / "skip_pkg"
    done = invoke("build", artifact, "--device", "cpu", "--quantize", "int8-weight-only",
                  "--quantize-skip", "lm_head,down_proj", "-o", out, "--quiet")  # fmt: skip
    assert done.exit_code == 0, done.stderr
    record = json.loads((out / "manifest.json").read_text())["quantization"]
    kept = {k["name"].rsplit(".", 1)[-1]: k["why"] for k in record["kept"]}
    assert kept == {"lm_head": "--quantize-skip lm_head", "down_proj": "--quantize-skip down_proj"}
    assert len(record["layers"]) == 6


def test_cpp_runner_generates_the_python_runtimes_tokens_on_a_quantized_package(llama, runner):
    package = llama[3]("int8-weight-only")
    done = run_cpp(
        runner, package, "--generate", *GENERATE_PROMPTS[0], "--max-new-tokens", 8, "--json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["generated_ids"] == python_generate(package, 8)


def test_int8_dynamic_one_call_model_is_close_to_eager(tmp_path):
    source = Path(__file__).parent / "zoo" / "bert.py"
    artifact = tmp_path / "bert.pt2"
    done = invoke("export", source, "-o", artifact)
    assert done.exit_code == 0, done.stderr
    package = tmp_path / "bert_pkg"
    done = invoke(
        "build", artifact, "--device", "cpu", "--quantize", "int8-dynamic", "-o", package, "--quiet"
    )
    assert done.exit_code == 0, done.stderr
    model = load_model_file(source)
    inputs = _module(source).example_inputs()
    loaded = aotc_runtime.load(package)
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
        got = aotc_runtime.flatten_outputs(loaded(**inputs))[0]
    error = float((got - want).norm() / want.norm())
    assert error < 0.05, error  # int8 activations and weights: about 1% per layer
    assert (
        json.loads((package / "manifest.json").read_text())["quantization"]["scheme"]
        == "int8-dynamic"
    )


def _module(source: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(source.stem, source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_tampered_scale_is_refused_by_the_hashes(llama, tmp_path):
    package = llama[3]("int8-weight-only")
    copy = tmp_path / "tampered"
    import shutil

    shutil.copytree(package, copy)
    data = bytearray((copy / "model.pt2").read_bytes())
    data[len(data) // 2] ^= 0xFF  # somewhere in the stored weights and scales
    (copy / "model.pt2").write_bytes(bytes(data))
    with pytest.raises(aotc_runtime.PackageError, match="model.pt2"):
        aotc_runtime.load(copy)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--quantize", "fp8"], "--quantize fp8 runs on cuda only; on the CPU use int8-weight-only"),
        (["--quantize", "int8-weight-only", "--group-size", "64"], "--group-size goes with --quantize int4"),
        (["--quantize", "int4-weight-only", "--group-size", "48"], "--group-size 48 is not one of 32, 64, 128, 256"),
        (["--quantize", "int4-weight-only", "--group-size", "128"], "--group-size 128 does not divide the 64"),
        (["--quantize-skip", "lm_head"], "--group-size, --quantize-skip and --quantize-method go with --quantize"),
        (["--quantize", "int8-weight-only", "--quantize-method", "gptq"],
         "--quantize-method gptq goes with --quantize int4-weight-only"),
        (["--quantize", "int4-weight-only", "--group-size", "32", "--quantize-method", "gptq"],
         "--quantize-method gptq needs the model's tokenizer"),
    ],
)  # fmt: skip
def test_bad_quantize_flags_exit_2_in_one_line(llama, tmp_path, flags, message):
    artifact = llama[0]
    done = invoke("build", artifact, "--device", "cpu", *flags, "-o", tmp_path / "pkg", "--quiet")
    assert done.exit_code == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "pkg").exists()


def test_gptq_for_a_model_that_is_not_a_language_model_exits_2(packages, tmp_path):
    """GPTQ calibrates on text fed through a generation step: a one-call model has neither."""
    artifact = packages.get("dynamic_mlp").artifact
    done = invoke(
        "build", artifact, "--device", "cpu", "--quantize", "int4-weight-only",
        "--group-size", "32", "--quantize-method", "gptq", "-o", tmp_path / "pkg", "--quiet",
    )  # fmt: skip
    assert done.exit_code == 2, done.stderr
    assert "--quantize-method gptq calibrates a language model on text" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "pkg").exists()


def test_a_model_without_linear_layers_exits_2(tmp_path):
    source = tmp_path / "conv.py"
    source.write_text(
        "import torch\n\ndef get_model():\n    return torch.nn.Conv2d(3, 4, 3)\n\n"
        "def example_inputs():\n    return (torch.randn(1, 3, 8, 8),)\n"
    )
    artifact = tmp_path / "conv.pt2"
    assert invoke("export", source, "-o", artifact).exit_code == 0
    done = invoke(
        "build",
        artifact,
        "--device",
        "cpu",
        "--quantize",
        "int8-weight-only",
        "-o",
        tmp_path / "pkg",
    )
    assert done.exit_code == 2 and "has no linear layers to quantize" in done.stderr, done.stderr


def test_a_layer_the_scheme_breaks_fails_the_build_naming_it(tmp_path):
    """One huge weight per group, on a feature the inputs leave at zero: int4's 16 levels hold the
    outlier and flatten the weights the output is made of."""
    source = tmp_path / "outliers.py"
    source.write_text(
        "import torch\n\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.proj = torch.nn.Linear(64, 32)\n        with torch.no_grad():\n"
        "            self.proj.weight[:, ::32] = 1e4\n\n    def forward(self, x):\n        return self.proj(x)\n\n"
        "def get_model():\n    torch.manual_seed(0)\n    return M()\n\n"
        "def example_inputs():\n    x = torch.randn(4, 64)\n    x[:, ::32] = 0\n    return (x,)\n"
    )
    artifact = tmp_path / "outliers.pt2"
    assert invoke("export", source, "-o", artifact).exit_code == 0
    done = invoke("build", artifact, "--device", "cpu", "--quantize", "int4-weight-only",
                  "--group-size", "32", "-o", tmp_path / "pkg")  # fmt: skip
    assert done.exit_code == 6, done.stderr
    assert re.search(r"breaks layer (\S+\.)?proj: ", done.stderr), done.stderr
    assert "--quantize-skip proj" in done.stderr
    assert not (tmp_path / "pkg").exists()


def test_fp8_scales_each_block_of_input_features_on_its_own():
    """fp8 stores a scale per output row and block of input features (the largest power of two
    up to 128 that divides them: 64 for 576). A large weight sets the scale of its own block only:
    with a scale per row it pushed the rest of its row into fp8's subnormals."""
    torch.manual_seed(0)
    w = torch.randn(32, 576) * 1e-4
    w[:, 5] = 10.0  # one large input feature in every row's first block
    q, scale = ql.fp8_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (32, 576 // 64)
    blocks = q.float().reshape(32, 9, 64)
    assert torch.equal(blocks.abs().amax(-1), torch.full((32, 9), ql.FP8_MAX))  # each block full
    rest = (slice(None), slice(64, None))  # the blocks without the large feature

    def error(back):
        return float((back - w)[rest].abs().mean() / w[rest].abs().mean())

    by_blocks = error(ql.fp8_blocks_dequantized(q, scale))
    by_rows = error(ql.fp8_rows_dequantized(*ql.fp8_rows(w)))
    assert by_blocks < 0.03 < 0.1 < by_rows  # e4m3's rounding alone, against the subnormals'
    assert ql.fp8_block_size(1536) == 128 and ql.fp8_block_size(2048) == 128


def test_fp8_keeps_the_output_layer_and_takes_the_others(llama):
    """An fp8 package keeps a language model's output layer (tied to its embedding here) in the
    base precision and quantizes every other linear layer; the manifest's record says why and
    gives the block of input features its scales cover."""
    from aotc.config import Precision
    from aotc.export.artifact import load_artifact
    from aotc.export.placement import place_program
    from aotc.export.quantization import FP8_OUTPUT_LAYER
    from aotc.quantize_schemes import FP8_BLOCK, Quantization

    artifact = llama[0]
    ep, meta = load_artifact(artifact)
    quantization = Quantization("fp8")
    # the build's reference pass: the layers it takes and keeps are the package's (whose CUDA
    # products the CPU cannot trace), its products dequantized
    placed = place_program(
        ep, "cpu", Precision("fp32"), meta.signature, quantization, Precision("bf16")
    )
    kept = {entry["name"]: entry["why"] for entry in quantization.kept}
    assert list(kept.values()) == [FP8_OUTPUT_LAYER] and next(iter(kept)).endswith("lm_head")
    scales = [name for name, _ in placed.named_buffers() if name.endswith("__scale")]
    weights = {
        node.args[1].target
        for node in ep.module().graph.nodes
        if node.target is torch.ops.aten.linear.default
    }  # the exported program's linear weights (its sibling products fused: q/k/v, gate/up)
    assert len(scales) == len(weights) - 1 > 0  # every other linear layer in fp8
    assert quantization.record()["group_size"] == FP8_BLOCK


def test_a_cpu_int8_output_layer_multiplies_in_fp32_where_the_others_take_the_kernel(llama):
    """On the CPU an int8 package's output layer keeps the activations' fp32 at decode's rows
    (logits rounded to bf16 cost a language model a tenth of int8's error): there it equals the
    fp32 product with the stored weight dequantized, where torch's int8 kernel, which every other
    layer takes, rounds to bf16. Above those rows it is the kernel's product."""
    from aotc.config import Precision
    from aotc.export.artifact import load_artifact
    from aotc.export.placement import place_program
    from aotc.export.quantization import cpu_int8_linear, cpu_int8_output_linear
    from aotc.quantize_schemes import Quantization

    torch.manual_seed(0)
    q, scale = ql.int8_rows(torch.randn(384, 64), torch.bfloat16)
    for rows in (1, ql.DECODE_ROWS):  # the reduction
        x = torch.randn(rows, 64)
        expected = torch.nn.functional.linear(x, ql.int8_rows_dequantized(q, scale))
        torch.testing.assert_close(
            cpu_int8_output_linear(x, q, scale, None), expected, rtol=1e-5, atol=1e-5
        )
        kernel_error = (cpu_int8_linear(x, q, scale, None) - expected).abs().max()
        assert kernel_error > 1e-3 * expected.abs().max()
    x = torch.randn(ql.DECODE_ROWS + 1, 64)  # the kernel
    assert torch.equal(
        cpu_int8_output_linear(x, q, scale, None), cpu_int8_linear(x, q, scale, None)
    )

    ep, meta = load_artifact(llama[0])
    placed = place_program(
        ep, "cpu", Precision("fp32"), meta.signature, Quantization("int8-weight-only")
    )
    kernels = sum(
        node.target is torch.ops.aten._weight_int8pack_mm.default for node in placed.graph.nodes
    )
    linears = sum(node.target is torch.ops.aten.linear.default for node in ep.graph.nodes)
    assert kernels == linears - 1 > 0  # every linear layer but the output layer
    # whose activations are made once, not again for each output feature inside its reduction
    realized = torch.ops.prims.inductor_force_stride_order.default
    assert sum(node.target is realized for node in placed.graph.nodes) == 1


@pytest.mark.parametrize(
    ("scheme", "group"), [("int8-weight-only", None), ("int4-weight-only", 32)]
)
def test_a_bf16_packages_reference_gathers_a_quantized_tied_embedding_in_fp32(
    generation_packages, scheme, group
):
    """The build's check of a bf16 package runs an fp32 reference on its weights dequantized: a
    tied embedding, quantized with the output layer, is gathered in fp32 there, the dtype the
    exported float program goes on in (a bf16 gather failed its re-export's dtype assertion)."""
    from aotc.compiler.verify import reference_program
    from aotc.config import Precision
    from aotc.export.artifact import load_artifact
    from aotc.quantize_schemes import Quantization

    ep, meta = load_artifact(generation_packages.artifact("gpt2"))  # its output layer is tied
    placed, _signature = reference_program(
        ep, meta.signature, "cpu", Precision("bf16"), Quantization(scheme, group)
    )
    gathers = [
        node
        for node in placed.graph.nodes
        if node.target is torch.ops.aten.embedding.default and "quantized" in str(node.args[0])
    ]
    assert gathers  # the tied embedding is the quantized one, not a float copy

    def first_floats(node) -> set:  # the dtypes the gathered levels are dequantized in
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.is_floating_point():
            return {val.dtype}
        return set().union(*(first_floats(user) for user in node.users))

    dequantized = set().union(*(first_floats(user) for node in gathers for user in node.users))
    assert dequantized == {torch.float32}


@pytest.mark.parametrize(
    ("scheme", "group", "bound"), [("int8-weight-only", None, 0.05), ("int4-weight-only", 32, 0.5)]
)
def test_gpt2s_conv1d_layers_are_quantized_like_linear_ones(
    generation_packages, scheme, group, bound
):
    """GPT-2's products are Conv1Ds (addmm over input-major weights): each is quantized as a
    linear layer over its weight transposed, none kept in the base precision, and the program's
    logits stay within the scheme's reach of the float program's (the zoo's random 64-wide
    GPT-2: int8 2%, int4 with groups of 32 29% of the largest logit)."""
    import copy

    from aotc.config import Precision
    from aotc.export.artifact import load_artifact
    from aotc.export.placement import place_program
    from aotc.quantize_schemes import Quantization

    ep, meta = load_artifact(generation_packages.artifact("gpt2"))
    quantization = Quantization(scheme, group)
    placed = place_program(ep, "cpu", Precision("fp32"), meta.signature, quantization)
    quantized = {".".join(layer["name"].split(".")[-2:]) for layer in quantization.layers}
    assert {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"} <= quantized
    assert len(quantization.layers) == 4 * 2 + 1 and quantization.kept == []
    example = list(ep.example_inputs[0])
    got = placed.module()(*copy.deepcopy(example))
    want = ep.module()(*copy.deepcopy(example))
    for ours, theirs in zip(got, want):
        assert 0 < float((ours - theirs).abs().max()) <= bound * float(theirs.abs().max())


def test_int4_tiles_are_refused_where_torch_lays_them_out_another_way(llama, runner):
    """torch's CPU int4 kernel lays its weights out per CPU capability (AVX512: 64 output features
    to a block; AVX2 and the plain kernel their own ways), chosen when torch starts: run on another,
    the package computed logits 0.56 off (relative) with no error. The manifest names the layout,
    and both runtimes refuse a torch that runs another, in one line with the package-error exit."""
    import os
    import subprocess
    import sys

    package = llama[3]("int4-weight-only")
    here = torch.backends.cpu.get_cpu_capability()
    device = json.loads((package / "manifest.json").read_text())["device"]
    assert device["aten_cpu_capability"] == here
    if here == "DEFAULT":
        pytest.skip("torch runs its plain CPU kernels here: there is no other layout to ask for")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    want = f"stores int4 weights in the layout of torch's {here} CPU kernels, but torch here runs its DEFAULT"
    python = subprocess.run(
        [sys.executable, "-m", "aotc", "generate", package, "--prompt-ids", "1,2"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    cpp = run_cpp(runner, package, env=env)
    for done in (python, cpp):
        assert done.returncode == 7 and want in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
