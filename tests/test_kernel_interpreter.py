"""What aotc's Triton kernels compute, run by Triton's interpreter on the CPU (`make test-kernels`
runs this file with TRITON_INTERPRET=1 and Triton beside .venv; CI's plain run has no Triton and
skips it): the split attention, its spans combined by a second kernel or by the last span to
finish, against its CPU reference (split_attention.py); the fused product's LayerNorm and gelu_new
prologues, and its RMSNorm, against the unfused computation (fused_products.reference). The GPU
tests hold the compiled kernels to the same references."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":  # the kernels' decorators read it when imported
    pytest.skip("run by `make test-kernels` with TRITON_INTERPRET=1", allow_module_level=True)

from aotc.export.fused_products import reference  # noqa: E402
from aotc.kernels.attention import attend  # noqa: E402
from aotc.kernels.split_attention import split_attention  # noqa: E402

pytestmark = [
    # Triton 3.6's interpreter reads a loop bound with int() of a one-element array: numpy 2.2
    # warns (2.4 refuses, hence the Makefile's numpy)
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    # it computes masked-off lanes too (an empty span's -inf - -inf), which the masks then drop
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]


@pytest.mark.parametrize("splits", [2, 8])
@pytest.mark.parametrize("window", [0, 40])
@pytest.mark.parametrize(
    "heads, kv_heads, dim, dtype",
    [(4, 2, 64, torch.float32), (9, 3, 64, torch.bfloat16), (2, 1, 128, torch.float32)],
)
def test_the_spans_folded_give_what_the_combine_kernel_gives(
    heads, kv_heads, dim, dtype, window, splits
):
    """Rows at different positions and a token that is no row's: the folded kernel writes what
    the combine kernel writes, bit for bit, both the CPU reference's output to the dtype's
    rounding, and every counter is back at 0."""
    g = torch.Generator().manual_seed(0)
    batch, length = 3, 200
    rows = torch.tensor([0, 1, 2, 0])
    positions = torch.tensor([length - 1, length - 8, 3, length])  # the last: no row's
    tokens = rows.shape[0]
    query = torch.randn(1, heads, tokens, dim, generator=g).to(dtype)
    keys = torch.randn(batch, length + 1, kv_heads, dim, generator=g).to(dtype)
    values = torch.randn(batch, length + 1, kv_heads, dim, generator=g).to(dtype)
    args = (query, keys, values, rows, positions, dim**-0.5, window, 0.0, splits)
    counts = torch.zeros(tokens * heads, dtype=torch.int32)
    plain = attend(*args, block_m=0)
    folded = attend(*args, block_m=0, fold=True, counts=counts)
    assert torch.equal(folded, plain)
    assert not counts.any()
    assert not folded[0, -1].any()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    want = split_attention(*args)
    torch.testing.assert_close(folded.float(), want.float(), atol=tolerance, rtol=tolerance)


# name -> (norm: None, "rms", "rms_rounded" (a model exported in the weights' dtype: the norm takes
# the row in fp32 and rounds the scaled row to its weight's dtype), "rms_upcast" (the same, the
# row given in that dtype: the residual stream, whose cast to fp32 the kernel makes) or "layer",
# the norm's bias, gelu, bias, residual)
FORMS = {
    "layer_norm": ("layer", True, False, True, False),
    "layer_norm-without-bias+residual": ("layer", False, False, False, True),
    "gelu+bias+residual": (None, False, True, True, True),
    "rms+residual": ("rms", False, False, False, True),
    "rms_rounded+residual": ("rms_rounded", False, False, False, True),
    "rms_upcast+residual": ("rms_upcast", False, False, False, True),
}


def product_inputs(form: str, dtype, rows: int, k_in: int, n_out: int, norm_spread: float):
    """((x, weight, bias, norm weight, residual), the fused product's options) of a FORMS form,
    seeded; the norm's weights 1 +- `norm_spread`."""
    norm, norm_bias, gelu, bias, residual = FORMS[form]
    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(rows, k_in, generator=g) + 0.5).to(dtype)
    weight = (torch.randn(n_out, k_in, generator=g) / k_in**0.5).to(dtype)
    b = torch.randn(n_out, generator=g).to(dtype) if bias else None
    nw = (1 + norm_spread * torch.randn(k_in, generator=g)).to(dtype) if norm else None
    nb = torch.randn(k_in, generator=g).to(dtype) if norm_bias else None
    r = torch.randn(rows, n_out, generator=g).to(dtype) if residual else None
    shape = {"norm_bias": nb, "layer_norm": norm == "layer", "gelu": gelu}
    if norm == "rms_rounded":
        x = x.float()  # the graph's x.to(float32), which the fused product reads
        shape["norm_rounded"] = True
    if norm == "rms_upcast":  # x in its dtype, its cast to fp32 the fused product's
        shape.update(norm_rounded=True, norm_upcast=True)
    return (x, weight, b, nw, r), shape


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rows, k_in, n_out, tile", [(1, 96, 40, (8, 64, 4)), (3, 200, 24, (8, 128, 4))]
)
def test_the_fused_products_prologues_compute_the_unfused_ones(
    form, dtype, rows, k_in, n_out, tile
):
    """Rows longer than a tile (the loop after the first tile), and a row whose width is not a
    power of two: fp32 to the sums' order, bf16 to an output's rounding."""
    from aotc.kernels.fused_gemv import fused_gemv

    (x, weight, b, nw, r), shape = product_inputs(form, dtype, rows, k_in, n_out, norm_spread=0.1)
    # the kernel reads any float row as fp32: `norm_upcast` tells the reference alone
    kernel_shape = {key: value for key, value in shape.items() if key != "norm_upcast"}
    got = fused_gemv(x, weight, b, nw, r, 1e-5, False, 0.0, shape=tile, **kernel_shape)
    want = reference(x, weight, b, nw, r, 1e-5, False, 0.0, **shape)
    assert got.dtype == want.dtype and got.shape == want.shape
    tolerance = 1e-5 if dtype == torch.float32 else 7e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rounded", [False, True])
def test_a_half_precision_row_gives_what_its_fp32_cast_gives(dtype, rounded):
    """An RMSNorm's input in bf16 or fp16 (a half-precision model's residual stream) and the same
    row cast to fp32 first (the cast the graph had, a kernel of its own on the GPU): the fused
    product computes the same bits from both, in the float and the int4 kernel."""
    from aotc.export.quantized_linear import int4_groups
    from aotc.kernels.fused_gemv import fused_gemv, fused_int4_gemv

    (x, weight, _, nw, r), _ = product_inputs("rms_upcast+residual", dtype, 3, 256, 40, 0.3)
    args = (weight, None, nw, r, 1e-5, False, 0.0)
    options = {"shape": (8, 128, 4), "norm_rounded": rounded}
    assert torch.equal(fused_gemv(x, *args, **options), fused_gemv(x.float(), *args, **options))
    packed, scale_zero = int4_groups(weight.float(), 64, dtype)
    int4 = (packed, scale_zero, 64, None, nw, r, 1e-5, False, 0.0, dtype)
    int4_options = {"shape": (8, 2, 4), "norm_rounded": rounded}
    assert torch.equal(
        fused_int4_gemv(x, *int4, **int4_options), fused_int4_gemv(x.float(), *int4, **int4_options)
    )
