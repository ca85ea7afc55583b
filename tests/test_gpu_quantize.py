"""Quantized packages on CUDA (marked gpu, skipped without CUDA): int8 and int4 weight-only and fp8,
built from the zoo's Llama (weights scaled as in test_generate.py) for batch 1, so that the build's
check and the decode run the products at one row (decode) and at a prompt's rows (prefill): int8
and fp8 through the Triton GEMV (aotc/kernels/gemv.py, one kernel for every row count),
int4 through tinygemm.

Each build's own check compares the package, at every step of a prefill and of decode, with its
weights dequantized in fp32 (the model the package means; tests/test_quantize.py compares that
model's tokens with transformers' on the CPU). Here each package's weights are measured against
bf16's, and its first token against the bf16 package's.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from conftest import GENERATION_MODEL_FILE, ZOO, invoke
from test_generate import prompts
from test_quantize import weights_bytes

import aotc_runtime

pytestmark = pytest.mark.gpu
MAX_LEN, NEW = 32, 12
SCHEMES = ("int8-weight-only", "int4-weight-only", "fp8")
# bf16 against bf16 on other kernels: the first tokens must agree (test_gpu_generate.py's rule)
AGREED_STEPS = 4
LOOSE = ["--atol", "1.0"]  # test_gpu_generate.py's GPU_BF16_LOGITS_ATOL: these LMs' logits reach 12
# weights against bf16's: the linears at about 1/2 and 1/4, the (unquantized, untied) embedding a
# fifth of the weights: int8 0.61, int4 g32 0.47; fp8 keeps the output layer (another fifth) too:
# about 0.71 with its scales
SIZE_AT_MOST = {"int8-weight-only": 0.65, "int4-weight-only": 0.5, "fp8": 0.75}


class Builds:
    def __init__(self, work):
        self.work, self.done = work, {}
        self.source = work / "llama_lm.py"
        self.source.write_text(
            textwrap.dedent(GENERATION_MODEL_FILE.format(zoo_file=str(ZOO / "llama.py")))
        )
        self.artifact = work / "llama.pt2"
        done = invoke(
            "export", self.source, "--task", "text-generation", "--max-seq-len", MAX_LEN,
            "--batch-size", 1, "-o", self.artifact,
        )  # fmt: skip
        assert done.exit_code == 0, done.stderr

    def __getitem__(self, scheme: str):
        if scheme not in self.done:
            package = self.work / f"llama_{scheme}_pkg"
            quantize = [] if scheme == "bf16" else ["--quantize", scheme]
            if scheme == "int4-weight-only":
                quantize += ["--group-size", "32"]  # the zoo Llama's 64 features
            done = invoke(
                "build", self.artifact, "--device", "cuda", "--mode", "reduce-overhead",
                "--precision", "bf16", *quantize, *LOOSE,
                "-o", package, "--quiet",
            )  # fmt: skip
            assert done.exit_code == 0, done.stderr
            self.done[scheme] = package
        return self.done[scheme]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return Builds(tmp_path_factory.mktemp("gpu_quantize"))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_package_checks_and_is_stored_smaller(built, scheme):
    package = built[scheme]
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["numeric_check"]["passed"]
    record = manifest["quantization"]
    # 2 layers x 4 stacked products, and the output layer, which fp8 keeps in the base precision
    quantized = 8 if scheme == "fp8" else 9
    assert record["scheme"] == scheme and len(record["layers"]) == quantized
    if scheme == "fp8":
        [kept] = record["kept"]
        assert kept["name"].endswith("lm_head"), kept
    ratio = weights_bytes(package) / weights_bytes(built["bf16"])
    assert ratio <= SIZE_AT_MOST[scheme], ratio


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_package_generates_in_a_cuda_graph(built, scheme):
    """Decode replays as a CUDA graph and gives varied tokens; int8's first token agrees with the
    bf16 package's. (int4 and fp8 move this random LM's sharpened logits enough to flip even the
    first token, as on the CPU: their agreement is measured on SmolLM2, docs/quantization.md.)"""
    ids, mask = prompts()
    alone = ids[:1]
    base = aotc_runtime.load(built["bf16"]).generate(alone, max_new_tokens=NEW, eos_token_ids=[])
    package = aotc_runtime.load(built[scheme])
    assert package.decode_graph() is not None, "decode replays as a CUDA graph"
    got = package.generate(alone, max_new_tokens=NEW, eos_token_ids=[])
    assert len(set(got[0, alone.shape[1] :].tolist())) > 3, "a degenerate sequence tests little"
    if scheme == "int8-weight-only":
        steps = alone.shape[1] + 1
        assert got[:, :steps].tolist() == base[:, :steps].tolist()


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("shape", [(192, 576), (2048, 8192), (8192, 2048)])
def test_the_fp8_block_gemv_multiplies_as_its_dequantized_weight(shape, rows):
    """The Triton GEMV with a scale per block of input features (fp8's), against the product of
    the weight it stores dequantized, in bf16 activations and in fp32 (exact products)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from aotc.export import quantized_linear as ql
    from aotc.kernels.gemv import blocks_gemv

    torch.manual_seed(0)
    n_out, k_in = shape
    w = torch.randn(n_out, k_in) * (1 + 20 * (torch.rand(n_out, k_in) > 0.999))
    q, scale = ql.fp8_blocks(w)
    x = torch.randn(rows, k_in)
    want = x @ ql.fp8_blocks_dequantized(q, scale).T
    q, scale = q.cuda(), scale.cuda()
    exact = blocks_gemv(x.cuda(), q, scale).cpu()
    torch.testing.assert_close(exact, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    half = blocks_gemv(x.cuda().bfloat16(), q, scale).float().cpu()
    assert (half - want).abs().max() <= 0.02 * want.abs().max()
