"""`aotc build --pdl` without a GPU: the launcher AOTInductor writes into a CUDA package, as the
build rewrites it (aotc/compiler/programmatic_launch.py). A package built with it is held to the
tokens of one without by tests/test_gpu_generate.py."""

from __future__ import annotations

import pytest
from torch._inductor.codegen import common

from aotc.compiler.programmatic_launch import (
    INDUCTOR_PDL_PREFIXES,
    PDL_PREFIX,
    launched_prefixes,
    programmatic_driver,
    programmatic_launches,
)
from aotc.errors import BuildError


def test_only_the_named_kernels_are_launched_programmatically():
    plain = common.get_device_op_overrides("cuda").kernel_driver()
    assert "cuLaunchKernelEx" not in plain
    with programmatic_launches((PDL_PREFIX, "triton_poi_")):
        driver = common.get_device_op_overrides("cuda").kernel_driver()
    # the same helpers, one launch helper replaced: the attribute for names with the prefixes,
    # and the plain launch for every other kernel
    assert driver.count("static inline void launchKernel(") == 1
    assert f'prefixes[] = {{"{PDL_PREFIX}", "triton_poi_"}};' in driver
    assert "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION" in driver
    assert driver.count("cuLaunchKernel(") == 1 and driver.count("cuLaunchKernelEx(") == 1
    assert (
        driver.replace(driver[driver.index("static inline bool") :], "")
        == plain[: plain.index("static inline void launchKernel(")]
    )
    # the usual launcher is back after the build
    assert common.get_device_op_overrides("cuda").kernel_driver() == plain
    with programmatic_launches(()):
        assert common.get_device_op_overrides("cuda").kernel_driver() == plain


def test_inductors_kernels_are_named_only_when_inductor_writes_their_wait():
    """Inductor writes the wait and release into its kernels under triton.enable_pdl (a --pdl
    build's default); without it only aotc's kernels are launched so."""
    assert launched_prefixes({}) == (PDL_PREFIX,)
    assert launched_prefixes({"triton.enable_pdl": False}) == (PDL_PREFIX,)
    assert launched_prefixes({"triton.enable_pdl": True}) == (PDL_PREFIX, *INDUCTOR_PDL_PREFIXES)
    # Inductor's templates get no wait (torch's _enable_pdl_codegen): never named
    assert not any(prefix.startswith("triton_tem") for prefix in INDUCTOR_PDL_PREFIXES)


def test_a_launcher_of_another_form_is_refused_not_patched():
    plain = common.get_device_op_overrides("cuda").kernel_driver()
    with pytest.raises(BuildError, match="--pdl: this torch's AOTInductor launches kernels"):
        programmatic_driver(plain.replace("cuLaunchKernel(", "cuLaunchKernel_v2("))


@pytest.mark.gpu
def test_inductor_sees_what_each_kernel_writes_with_the_wait_compiled_in():
    """AOTInductor copies every argument of a user Triton kernel it cannot analyse (it assumes
    each one written): an impure inline asm makes it give up, and then a package copies each
    weight before each product. The wait is declared pure so that the analysis still finds
    only the outputs."""
    import torch
    from torch._higher_order_ops import triton_kernel_wrap as analysis

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the wait is compiled in from compute capability 9.0")

    from kernel_launches import attention_case, recorded

    from aotc.kernels import attention
    from aotc.kernels.fused_gemv import fused_gemv

    def written(kernel, arguments) -> list:
        if not hasattr(analysis, "identify_accessed_tensors"):  # torch 2.11's name and answer
            return sorted(analysis.identify_mutated_tensors(kernel, arguments, {}))
        accesses = analysis.identify_accessed_tensors(kernel, arguments, {})
        return sorted(dep.name for dep in accesses.read_writes.writes)

    bf16 = {"dtype": torch.bfloat16, "device": "cuda"}
    x, w, norm = torch.randn(1, 64, **bf16), torch.randn(32, 64, **bf16), torch.randn(64, **bf16)
    residual = torch.randn(1, 32, **bf16)
    [(kernel, named)] = recorded(fused_gemv, x, w, None, norm, residual, 1e-5, False, 0.0, pdl=True)
    assert (named["PDL"], written(kernel, named)) == (True, ["out_ptr"])

    launched = recorded(attention.attend, *attention_case(torch.bfloat16, "cuda"))
    found = {
        kernel.fn.__name__: (named["PDL"], written(kernel, named)) for kernel, named in launched
    }
    assert found == {
        "aotc_pdl_tiled_attention": (True, ["out_ptr"]),
        "aotc_pdl_attention": (True, ["part_ptr"]),
        "aotc_pdl_combine": (True, ["out_ptr"]),
    }
