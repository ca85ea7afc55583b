"""aotc's Triton kernels through Triton's front end and AOTInductor's analysis of them, on any
machine with Triton installed, GPU or not (a Hopper target stubbed in; CI's CPU machine has no
Triton and skips the file).

Two faults reached the GPU before this check existed, and each cost a GPU session:
- a kernel Triton refuses to compile (a loop-carried tile that changed dtype inside the loop):
  Triton's interpreter, the CPU check of what the kernels compute, does not type loop variables;
- a kernel AOTInductor cannot analyse (an impure inline asm): it then assumes every argument
  written, and a package copies each weight before each product.

Each kernel is launched by its own launcher with a recorder in place of Triton's launch (the
arguments it would be called with, by name), in every form a build uses: float, int8 rows, fp8
blocks and int4 groups; fp32 and bf16; with and without the PDL wait; then lowered to Triton's IR
(torch's generate_ttir, what AOTInductor runs) and analysed (identify_accessed_tensors)."""

from __future__ import annotations

import functools

import pytest
import torch

triton = pytest.importorskip("triton")
analysis = pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")
if not hasattr(analysis, "identify_accessed_tensors"):  # torch before 2.12: the GPU test's job
    pytest.skip("needs torch's identify_accessed_tensors (2.12+)", allow_module_level=True)

from kernel_launches import attention_case, recorded  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)


class _HopperWithoutGpu:
    """Triton's active driver, answering only what lowering to its IR asks: the target."""

    def get_current_target(self):
        return HOPPER

    def get_current_device(self):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_benchmarker(self):  # pragma: no cover (not asked while lowering)
        raise RuntimeError("no GPU to time on")


@pytest.fixture
def hopper():
    config = triton.runtime.driver
    before = config._active  # None until asked: reset_active() would look for a GPU driver
    config.set_active(_HopperWithoutGpu())
    yield
    config._active = before


def written(kernel, arguments: dict) -> list[str]:
    """The arguments AOTInductor finds the kernel writing, after lowering it to Triton's IR (a
    kernel the front end refuses raises here, with Triton's message)."""
    analysis.generate_ttir(kernel, arguments, {})
    accesses = analysis.identify_accessed_tensors(kernel, arguments, {})
    return sorted(dep.name for dep in accesses.read_writes.writes)


DTYPES = [torch.float32, torch.bfloat16]
FORMS = ["float", "int8", "fp8"]


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("neighbours", ["norm", "gated+residual", "layer_norm+residual", "gelu"])
def test_the_fused_product_lowers_and_writes_only_its_output(hopper, form, dtype, neighbours, pdl):
    from aotc.kernels.fused_gemv import fused_gemv

    if form == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no fp8 dtype in this torch")
    n_out, k_in = 96, 256
    weight = torch.randn(n_out, k_in).to(dtype)
    scale = None
    if form == "int8":
        weight, scale = torch.zeros(n_out, k_in, dtype=torch.int8), torch.ones(n_out, dtype=dtype)
    elif form == "fp8":
        weight = torch.zeros(n_out, k_in, dtype=torch.float8_e4m3fn)
        scale = torch.ones(n_out, k_in // 128, dtype=torch.float32)
    gated, gelu = "gated" in neighbours, neighbours == "gelu"
    layer_norm = "layer_norm" in neighbours
    x = torch.randn(2, 2 * k_in if gated else k_in, dtype=dtype)
    norm = None if gated or gelu else torch.randn(k_in, dtype=dtype)
    norm_bias = torch.randn(k_in, dtype=dtype) if layer_norm else None
    residual = torch.randn(2, n_out, dtype=dtype) if "residual" in neighbours else None
    # two blocks of input features: the loop after the first tile is lowered too
    launches = recorded(
        fused_gemv, x, weight, None, norm, residual, 1e-5, gated, 0.0,
        shape=(16, 128, 4), pdl=pdl, scale=scale, operand_dtype=None if scale is None else dtype,
        norm_bias=norm_bias, layer_norm=layer_norm, gelu=gelu,
    )  # fmt: skip
    assert [(kernel.fn.__name__, written(kernel, values)) for kernel, values in launches] == [
        ("aotc_pdl_fused_gemv", ["out_ptr"])
    ]


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_fused_int4_product_lowers_and_writes_only_its_output(hopper, dtype, pdl):
    from aotc.kernels.fused_gemv import fused_int4_gemv

    n_out, k_in, group = 64, 512, 64
    packed = torch.zeros(n_out, k_in // 2, dtype=torch.uint8)
    scale_zero = torch.ones(n_out, k_in // group, 2, dtype=dtype)
    x, norm = torch.randn(1, k_in, dtype=dtype), torch.randn(k_in, dtype=dtype)
    residual = torch.randn(1, n_out, dtype=dtype)
    launches = recorded(
        fused_int4_gemv, x, packed, scale_zero, group, None, norm, residual, 1e-5, False, 0.0,
        dtype, shape=(8, 2, 4), pdl=pdl,
    )  # fmt: skip
    assert [(kernel.fn.__name__, written(kernel, values)) for kernel, values in launches] == [
        ("aotc_pdl_fused_int4_gemv", ["out_ptr"])
    ]


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_attention_kernels_lower_and_write_only_their_outputs(
    hopper, monkeypatch, dtype, pdl, fold
):
    from aotc.kernels import attention

    monkeypatch.setattr(attention, "waits_programmatically", lambda device: pdl)
    attend = functools.partial(attention.attend, fold=fold)
    launches = recorded(attend, *attention_case(dtype))  # tiled and split forms
    found = {
        kernel.fn.__name__: (values["PDL"], written(kernel, values)) for kernel, values in launches
    }
    split = "aotc_pdl_attention"
    if fold:  # the last span combines: the output and its counter written, no second kernel
        assert found.pop(split) == (pdl, ["count_ptr", "out_ptr", "part_ptr"])
    else:
        assert found.pop(split) == (pdl, ["part_ptr"])
        assert found.pop("aotc_pdl_combine") == (pdl, ["out_ptr"])
    assert found == {"aotc_pdl_tiled_attention": (pdl, ["out_ptr"])}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["int8", "fp8"])
def test_the_split_quantized_product_lowers_and_writes_only_its_sums(
    hopper, monkeypatch, form, dtype
):
    from aotc.kernels import gemv

    if form == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no fp8 dtype in this torch")
    monkeypatch.setattr(gemv, "streaming_multiprocessors", lambda device: 132)  # an H100's
    n_out, k_in = 128, 512
    x = torch.randn(2, k_in, dtype=dtype)
    if form == "int8":
        weight, scale = torch.zeros(n_out, k_in, dtype=torch.int8), None
    else:
        weight = torch.zeros(n_out, k_in, dtype=torch.float8_e4m3fn)
        scale = torch.ones(n_out, k_in // 128, dtype=torch.float32)
    launches = recorded(gemv.partial_products, x, weight, scale)
    assert [(kernel.fn.__name__, written(kernel, values)) for kernel, values in launches] == [
        ("_gemv_kernel", ["out_ptr"])
    ]


# SmolLM2-135M's and Llama-3.2-1B's fused products (output x input features), at an H100's and
# an H200's streaming multiprocessors: every tile a build may time lowers, in each weight form
@pytest.mark.parametrize("programs", [132, 144])
@pytest.mark.parametrize("form", ["bfloat16", "int8", "float8_e4m3fn", "int4g64"])
@pytest.mark.parametrize(
    "n_out, k_in", [(960, 576), (576, 576), (3072, 576), (576, 1536), (3072, 2048), (2048, 8192)]
)
def test_every_tile_a_build_times_lowers(hopper, n_out, k_in, form, programs):
    from aotc.kernels import product_tiles, tile_timing
    from aotc.kernels.fused_gemv import fused_gemv, fused_int4_gemv

    key = product_tiles.key_of(n_out, k_in, form, "plain")
    x = torch.zeros(1, k_in, dtype=torch.bfloat16)
    if form == "int4g64":
        packed = torch.zeros(n_out, k_in // 2, dtype=torch.uint8)
        scale_zero = torch.ones(n_out, k_in // 64, 2, dtype=torch.bfloat16)
        args = (fused_int4_gemv, x, packed, scale_zero, 64, None, None, None, 0.0, False, 0.0,
                torch.bfloat16)  # fmt: skip
        kwargs: dict = {}
    else:
        weight = torch.zeros(n_out, k_in, dtype=getattr(torch, form))
        scale = {"int8": torch.ones(n_out), "float8_e4m3fn": torch.ones(n_out, k_in // 64)}
        args = (fused_gemv, x, weight, None, None, None, 0.0, False, 0.0)
        kwargs = {"scale": scale.get(form)}
        kwargs["operand_dtype"] = torch.bfloat16 if kwargs["scale"] is not None else None
    for tile in product_tiles.candidates_for(key, tile_timing.rule_for(key, programs)):
        launches = recorded(*args, shape=tile, **kwargs)
        assert [written(kernel, values) for kernel, values in launches] == [["out_ptr"]], tile


def test_the_rule_for_a_key_is_its_kernels_launch_rule():
    from aotc.kernels import tile_timing as tt
    from aotc.kernels.fused_gemv import int4_launch_shape, launch_shape

    assert tt.rule_for((3072, 2048, "int4g128", "norm"), 132) == int4_launch_shape(
        3072, 2048, 128, 132
    )
    assert tt.rule_for((3072, 2048, "int8", "norm"), 132) == launch_shape(3072, 2048, 132)


def test_the_product_takes_the_tile_in_force_for_its_weight(hopper):
    from aotc.kernels import product_tiles
    from aotc.kernels.fused_gemv import fused_gemv

    weight, x = (
        torch.zeros(960, 576, dtype=torch.bfloat16),
        torch.zeros(1, 576, dtype=torch.bfloat16),
    )
    with product_tiles.tiles_in_force(
        {product_tiles.key_of(960, 576, torch.bfloat16, "plain"): (4, 256, 4)}
    ):
        [(_kernel, values)] = recorded(fused_gemv, x, weight, None, None, None, 0.0, False, 0.0)
    assert (values["BLOCK_N"], values["BLOCK_K"]) == (4, 256)


def test_the_build_finds_the_fused_products_it_times(hopper):
    """The keys are read from the exported program the build compiles: each fused product's
    weight shape and form (float, int8 rows, int4 groups with their group), once each."""
    from aotc.kernels import product_tiles
    from aotc.kernels.fused_gemv import fused_gemv_cuda  # noqa: F401 (registers the ops)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(96, 256))
            self.q = torch.nn.Buffer(torch.zeros(64, 96, dtype=torch.int8))
            self.s = torch.nn.Buffer(torch.ones(64))
            self.p = torch.nn.Buffer(torch.zeros(96, 32, dtype=torch.uint8))
            self.sz = torch.nn.Buffer(torch.ones(96, 2, 2))
            self.nw = torch.nn.Buffer(torch.ones(96))

        def forward(self, x):
            y = torch.ops.aotc.fused_gemv_cuda(
                x, self.w, None, None, None, 0.0, False, 0.0, None, x.dtype
            )
            z = torch.ops.aotc.fused_gemv_cuda(
                y, self.q, None, self.nw, None, 1e-5, False, 0.0, self.s, x.dtype
            )
            again = torch.ops.aotc.fused_gemv_cuda(
                x, self.w, None, None, None, 0.0, False, 0.0, None, x.dtype
            )
            w4 = torch.ops.aotc.fused_int4_gemv_cuda(
                z, self.p, self.sz, 32, None, None, again, 0.0, False, 0.0, x.dtype
            )
            return again, w4

    tiles = {
        product_tiles.key_of(96, 256, torch.float32, "plain"): (8, 256, 4),
        product_tiles.key_of(64, 96, torch.int8, "norm"): (8, 128, 4),
        product_tiles.key_of(96, 64, "int4g32", "residual"): (8, 2, 4),
    }
    with product_tiles.tiles_in_force(tiles):  # no GPU to take the launch rule's counts from
        program = torch.export.export(Step(), (torch.randn(1, 256),), strict=False)
    assert product_tiles.fused_product_keys(program.graph_module) == [
        (96, 256, "float32", "plain"), (64, 96, "int8", "norm"), (96, 64, "int4g32", "residual")
    ]  # fmt: skip


def test_aotcs_kernels_carry_the_prefix_the_pdl_launcher_picks():
    """A package's PDL launcher picks kernels by name (aotc/compiler/programmatic_launch.py): each
    Triton kernel of aotc's that waits for its predecessor is named with the prefix. The helpers
    (`_`-named, and programmatic.after_predecessor) are inlined into them, never launched."""
    from aotc.compiler.programmatic_launch import PDL_PREFIX
    from aotc.kernels import attention, fused_gemv

    names = {
        kernel.fn.__name__
        for module in (attention, fused_gemv)
        for kernel in vars(module).values()
        if hasattr(kernel, "fn")
        and kernel.fn.__module__ == module.__name__
        and "PDL" in getattr(kernel, "arg_names", [])
        and not kernel.fn.__name__.startswith("_")
    }
    assert names == {
        "aotc_pdl_attention",
        "aotc_pdl_combine",
        "aotc_pdl_tiled_attention",
        "aotc_pdl_fused_gemv",
        "aotc_pdl_fused_int4_gemv",
    }
    assert all(name.startswith(PDL_PREFIX) for name in names)


@pytest.fixture(scope="module")
def kernel_sass():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "kernel_sass.py"
    spec = importlib.util.spec_from_file_location("kernel_sass", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "weight, k_in, tile",
    [("bf16", 8192, (8, 1024, 8)), ("int8", 8192, (8, 1024, 8)), ("fp8", 8192, (8, 1024, 8)),
     ("int4", 2048, (16, 4, 8))],
)  # fmt: skip
@pytest.mark.parametrize("around", ["norm", "gated+residual"])
def test_each_product_compiles_to_hopper_machine_code(kernel_sass, weight, k_in, tile, around):
    """Through ptxas to SASS for compute capability 9.0 (what the GPU's first build would find:
    an inline asm ptxas refuses, registers it cannot allocate), and scripts/kernel_sass.py finds
    the main loop and its multiply-adds, a byte of weight costing some instructions."""
    kernel = kernel_sass.compiled(weight, k_in, tile, around, 128)
    loop = kernel_sass.main_loop(kernel_sass.sass_of(kernel))
    assert loop["FFMA"] > 0 and loop["LDG"] > 0, loop
    assert 1 < sum(loop.values()) / kernel_sass.weight_bytes_a_thread(weight, tile, 128) < 200
