"""Decoder LMs in bf16 and fp16 on the GPU (marked gpu, skipped without CUDA).

Each zoo decoder LM is exported once in fp32 and built in bf16 and fp16 on CUDA; the build's own
check compares it with the fp32 program within the precision's tolerance, and this test compares
the package with the same model run eagerly in that precision.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import invoke

import aotc_runtime

pytestmark = pytest.mark.gpu
ZOO = Path(__file__).parent / "zoo"
DECODER_LMS = ("llama.py", "gpt2.py", "qwen2.py", "mistral.py", "gpu/llama_120m.py")
# logits of order 1: bf16 keeps 8 bits of mantissa, fp16 11 (the build's own tolerances)
TOLERANCE = {"bf16": 5e-2, "fp16": 1e-2}
DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def zoo_module(file: str):
    spec = importlib.util.spec_from_file_location(Path(file).stem, ZOO / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("file", DECODER_LMS)
def test_a_decoder_lm_builds_and_matches_eager_in_reduced_precision(file, precision, tmp_path):
    artifact, package = tmp_path / "lm.pt2", tmp_path / "lm_pkg"
    torch.manual_seed(0)  # the export's model and the eager one below share their weights
    assert invoke("export", ZOO / file, "-o", artifact).exit_code == 0
    result = invoke(
        "build", artifact, "--device", "cuda", "--precision", precision, "-o", package, "--quiet"
    )
    assert result.exit_code == 0, result.stderr
    module = zoo_module(file)
    torch.manual_seed(0)
    model = module.get_model().eval().to("cuda", DTYPE[precision])
    inputs = {k: v.cuda() for k, v in module.example_inputs().items()}
    with torch.no_grad():
        reference = model(**inputs).logits.float()
    got = aotc_runtime.load(package)(**inputs)["logits"]
    tol = TOLERANCE[precision]
    # against eager at the same precision: two roundings of the same computation
    assert (got - reference).abs().max().item() <= tol * (1 + reference.abs().max().item())
