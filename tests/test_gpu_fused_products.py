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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("rows, k_in, n_out", [(1, 576, 960), (3, 2048, 72)])
def test_a_half_precision_models_rmsnorm_rounds_its_scaled_row_as_the_unfused_one(
    dtype, residual, rows, k_in, n_out
):
    """A model exported in bf16 or fp16 rounds the scaled row to its dtype before the norm's
    weight multiplies it (`norm_rounded`): the float kernel and the int4 kernel, against
    `reference` with the same rounding."""
    from aotc.export.fused_products import reference
    from aotc.export.quantized_linear import int4_groups, int4_groups_dequantized
    from aotc.kernels.fused_gemv import fused_gemv, fused_int4_gemv

    torch.manual_seed(0)
    device = "cuda"
    x = 3 * torch.randn(rows, k_in, device=device)  # the graph's x.to(float32)
    weight = (torch.randn(n_out, k_in, device=device) / k_in**0.5).to(dtype)
    nw = (1 + 0.5 * torch.randn(k_in, device=device)).to(dtype)
    r = torch.randn(rows, n_out, device=device).to(dtype) if residual else None
    got = fused_gemv(x, weight, None, nw, r, 1e-6, False, 0.0, norm_rounded=True)
    expected = reference(x, weight, None, nw, r, 1e-6, False, 0.0, norm_rounded=True)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    # outputs of a few units: an output's rounding or two apart, against their scale
    scale = expected.float().abs().max().item()
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2 * scale)

    packed, scale_zero = int4_groups(torch.randn(n_out, k_in, device=device), 64, dtype)
    dequantized = int4_groups_dequantized(packed, scale_zero, 64)
    got = fused_int4_gemv(
        x, packed, scale_zero, 64, None, nw, r, 1e-6, False, 0.0, dtype, norm_rounded=True
    )
    product = reference(x, dequantized, None, nw, None, 1e-6, False, 0.0, norm_rounded=True)
    expected = product.to(dtype) if r is None else r + product.to(dtype)
    scale = expected.float().abs().max().item()
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2 * scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rounded", [False, True])
def test_the_kernels_read_a_half_precision_row_as_its_fp32_cast(dtype, rounded):
    """A half-precision model's residual stream given to an RMSNorm product in its dtype (the
    fused program's `norm_upcast`: the graph's cast to fp32 left to the kernel) and the same row
    cast first: the same bits, in the float and the int4 kernel."""
    from aotc.export.quantized_linear import int4_groups
    from aotc.kernels.fused_gemv import fused_gemv, fused_int4_gemv

    torch.manual_seed(0)
    device = "cuda"
    rows, k_in, n_out = 3, 576, 960
    x = (3 * torch.randn(rows, k_in, device=device)).to(dtype)
    weight = (torch.randn(n_out, k_in, device=device) / k_in**0.5).to(dtype)
    nw = (1 + 0.3 * torch.randn(k_in, device=device)).to(dtype)
    r = torch.randn(rows, n_out, device=device).to(dtype)
    args = (weight, None, nw, r, 1e-6, False, 0.0)
    assert torch.equal(
        fused_gemv(x, *args, norm_rounded=rounded),
        fused_gemv(x.float(), *args, norm_rounded=rounded),
    )
    packed, scale_zero = int4_groups(weight.float(), 64, dtype)
    int4 = (packed, scale_zero, 64, None, nw, r, 1e-6, False, 0.0, dtype)
    assert torch.equal(
        fused_int4_gemv(x, *int4, norm_rounded=rounded),
        fused_int4_gemv(x.float(), *int4, norm_rounded=rounded),
    )


GPT2_FORMS = {  # name -> (layer norm, its bias, gelu_new, product bias, residual)
    "layer_norm": (True, True, False, True, False),
    "layer_norm-without-bias+residual": (True, False, False, False, True),
    "gelu+bias+residual": (False, False, True, True, True),
}


@pytest.mark.parametrize("scheme", [None, "int8-weight-only"])
@pytest.mark.parametrize("form", GPT2_FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, k_in, n_out", [(1, 768, 2304), (5, 96, 200), (2, 3072, 768)])
def test_the_kernel_takes_a_layer_norm_or_gelu_new_in(scheme, form, dtype, rows, k_in, n_out):
    """GPT-2's neighbours (LayerNorm with a bias before q/k/v and the MLP, gelu_new before the
    MLP's second product), float and int8 weights, against the unfused computation."""
    from aotc.export.fused_products import reference
    from aotc.export.quantized_linear import int8_rows
    from aotc.kernels.fused_gemv import fused_gemv

    layer_norm, norm_bias, gelu, bias, residual = GPT2_FORMS[form]
    torch.manual_seed(0)
    device = "cuda"
    # the norm's input and weights of one dtype, as aten.layer_norm on the GPU wants them
    x = (3 * torch.randn(rows, k_in, device=device) + 0.5).to(dtype)
    w = torch.randn(n_out, k_in, device=device) / k_in**0.5
    weight, scale = int8_rows(w, dtype) if scheme else (w.to(dtype), None)
    b = torch.randn(n_out, device=device).to(dtype) if bias else None
    nw = (1 + 0.1 * torch.randn(k_in, device=device)).to(dtype) if layer_norm else None
    nb = torch.randn(k_in, device=device).to(dtype) if norm_bias else None
    r = torch.randn(rows, n_out, device=device).to(dtype) if residual else None
    operand = None if scale is None else dtype
    shape = {"norm_bias": nb, "layer_norm": layer_norm, "gelu": gelu}
    got = fused_gemv(
        x, weight, b, nw, r, 1e-5, False, 0.0, scale=scale, operand_dtype=operand, **shape
    )
    expected = reference(x, weight, b, nw, r, 1e-5, False, 0.0, scale, operand, **shape)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("scheme", ["int8-weight-only", "fp8"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, k_in, n_out", [(1, 576, 960), (3, 4096, 72)])
def test_the_kernel_computes_the_unfused_int8_and_fp8_products(
    scheme, form, dtype, rows, k_in, n_out
):
    """int8-weight-only: the int8 rows multiplied as stored, each output feature's sum scaled;
    fp8: each weight times its block's scale inside the sum. Against the unfused program's own
    products (quantization.py's cuda_int8_linear and fp8_linear)."""
    from aotc.export.fused_products import reference
    from aotc.export.quantized_linear import fp8_blocks, int8_rows
    from aotc.kernels.fused_gemv import fused_gemv

    if scheme == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9")
    norm, gated, bias, residual, clamp = FORMS[form]
    torch.manual_seed(0)
    device = "cuda"
    x = torch.randn(rows, 2 * k_in if gated else k_in, device=device)
    x = x if norm else x.to(dtype)
    w = torch.randn(n_out, k_in, device=device) / k_in**0.5
    q, scale = int8_rows(w, dtype) if scheme == "int8-weight-only" else fp8_blocks(w)
    b = torch.randn(n_out, device=device).to(dtype) if bias else None
    nw = (1 + 0.1 * torch.randn(k_in, device=device)).to(dtype) if norm else None
    r = torch.randn(rows, n_out, device=device) if residual else None
    got = fused_gemv(x, q, b, nw, r, 1e-6, gated, clamp, scale=scale, operand_dtype=dtype)
    expected = reference(x, q, b, nw, r, 1e-6, gated, clamp, scale, dtype)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    # fp32: the same products summed in another order, over up to 4,096 features
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, k_in, n_out, group", [(1, 576, 960, 64), (3, 2048, 72, 128)])
def test_the_int4_kernel_computes_the_product_of_the_dequantized_weights(
    form, dtype, rows, k_in, n_out, group
):
    """aotc's product over int4 groups as aotc stores them (quantized_linear.int4_groups): the
    unfused computation with the weights dequantized, the output rounded to the operand's dtype
    and the bias added after, as the int4 product and its bias add round."""
    from aotc.export.fused_products import reference
    from aotc.export.quantized_linear import int4_groups, int4_groups_dequantized
    from aotc.kernels.fused_gemv import fused_int4_gemv

    norm, gated, bias, residual, clamp = FORMS[form]
    torch.manual_seed(0)
    device = "cuda"
    x = torch.randn(rows, 2 * k_in if gated else k_in, device=device)
    x = x if norm else x.to(dtype)
    packed, scale_zero = int4_groups(torch.randn(n_out, k_in, device=device), group, dtype)
    dequantized = int4_groups_dequantized(packed, scale_zero, group)  # fp32, as the kernel
    b = torch.randn(n_out, device=device).to(dtype) if bias else None
    nw = (1 + 0.1 * torch.randn(k_in, device=device)).to(dtype) if norm else None
    r = torch.randn(rows, n_out, device=device) if residual else None
    got = fused_int4_gemv(x, packed, scale_zero, group, b, nw, r, 1e-6, gated, clamp, dtype)
    product = reference(x, dequantized, None, nw, None, 1e-6, gated, clamp).to(dtype)
    expected = product if b is None else product + b
    expected = expected if r is None else r + expected
    assert got.dtype == expected.dtype and got.shape == expected.shape
    # fp32: the same sums in another order; bf16: the operand rounded to bf16 in the kernel (not
    # here) and the output's roundings, against the outputs' scale
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    scale = expected.float().abs().max().item()
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance * scale)
