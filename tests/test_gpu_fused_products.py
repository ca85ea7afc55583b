"""aotc's fused product kernel on the GPU (aotc/kernels/fused_gemv.py): held to `reference`, the
unfused computation (aotc/export/fused_products.py), in fp32 and bf16, with every prologue and
epilogue, at decode's row counts and at shapes whose sizes are not multiples of the tiles (a
package built with it is held to one built without it in tests/test_gpu_generate.py)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

FORMS = {  # name -> (norm, gated, bias, residual, clamp)
    "norm": (True, False, False, False, 0.0),
    "norm+bias+clamp": (True, False, True, False, 3.0e38),
    "gated+residual": (False, True, False, True, 0.0),
    "plain+residual+clamp": (False, False, False, True, 3.0e38),
    "norm+residual": (True, False, False, True, 0.0),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, k_in, n_out", [(1, 576, 960), (5, 96, 200), (16, 2048, 64)])
def test_the_kernel_computes_the_unfused_product(form, dtype, rows, k_in, n_out):
    from aotc.export.fused_products import reference
    from aotc.kernels.fused_gemv import fused_gemv

    norm, gated, bias, residual, clamp = FORMS[form]
    torch.manual_seed(0)
    device = "cuda"
    # the residual stream is fp32 in a bf16 build (transformers' norm casts up), as here
    x = torch.randn(rows, 2 * k_in if gated else k_in, device=device)
    x = x if norm else x.to(dtype)
    weight = (torch.randn(n_out, k_in, device=device) / k_in**0.5).to(dtype)
    b = torch.randn(n_out, device=device).to(dtype) if bias else None
    nw = (1 + 0.1 * torch.randn(k_in, device=device)).to(dtype) if norm else None
    r = torch.randn(rows, n_out, device=device) if residual else None
    got = fused_gemv(x, weight, b, nw, r, 1e-6, gated, clamp)
    expected = reference(x, weight, b, nw, r, 1e-6, gated, clamp)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    # fp32: the same products summed in another order (cuBLAS's fp32 is not TF32 by default);
    # bf16: one rounding of the output apart
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, k_in, n_out", [(1, 576, 960), (3, 4100, 72)])
def test_the_kernel_computes_the_unfused_int8_product(form, dtype, rows, k_in, n_out):
    """int8-weight-only: the int8 rows multiplied as stored, each output feature's sum scaled,
    against the unfused program's own int8 product (quantization.py's cuda_int8_linear)."""
    from aotc.export.fused_products import reference
    from aotc.export.quantized_linear import int8_rows
    from aotc.kernels.fused_gemv import fused_gemv

    norm, gated, bias, residual, clamp = FORMS[form]
    torch.manual_seed(0)
    device = "cuda"
    x = torch.randn(rows, 2 * k_in if gated else k_in, device=device)
    x = x if norm else x.to(dtype)
    q, scale = int8_rows(torch.randn(n_out, k_in, device=device) / k_in**0.5, dtype)
    b = torch.randn(n_out, device=device).to(dtype) if bias else None
    nw = (1 + 0.1 * torch.randn(k_in, device=device)).to(dtype) if norm else None
    r = torch.randn(rows, n_out, device=device) if residual else None
    got = fused_gemv(x, q, b, nw, r, 1e-6, gated, clamp, scale=scale, operand_dtype=dtype)
    expected = reference(x, q, b, nw, r, 1e-6, gated, clamp, scale, dtype)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
