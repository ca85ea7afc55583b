"""`aotc build --pdl` without a GPU: the launcher AOTInductor writes into a CUDA package, as the
build rewrites it (aotc/compiler/programmatic_launch.py). A package built with it is held to the
tokens of one without by tests/test_gpu_generate.py."""

from __future__ import annotations

import pytest
from torch._inductor.codegen import common

from aotc.compiler.programmatic_launch import PDL_PREFIX, programmatic_driver, programmatic_launches
from aotc.errors import BuildError


def test_only_aotcs_kernels_are_launched_programmatically():
    plain = common.get_device_op_overrides("cuda").kernel_driver()
    assert "cuLaunchKernelEx" not in plain
    with programmatic_launches(True):
        driver = common.get_device_op_overrides("cuda").kernel_driver()
    # the same helpers, one launch helper replaced: the attribute for names with the prefix, and
    # the plain launch for every other kernel
    assert driver.count("static inline void launchKernel(") == 1
    assert f'const char* prefix = "{PDL_PREFIX}";' in driver
    assert "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION" in driver
    assert driver.count("cuLaunchKernel(") == 1 and driver.count("cuLaunchKernelEx(") == 1
    assert (
        driver.replace(driver[driver.index("static inline bool") :], "")
        == plain[: plain.index("static inline void launchKernel(")]
    )
    # the usual launcher is back after the build
    assert common.get_device_op_overrides("cuda").kernel_driver() == plain
    with programmatic_launches(False):
        assert common.get_device_op_overrides("cuda").kernel_driver() == plain


def test_a_launcher_of_another_form_is_refused_not_patched():
    plain = common.get_device_op_overrides("cuda").kernel_driver()
    with pytest.raises(BuildError, match="--pdl: this torch's AOTInductor launches kernels"):
        programmatic_driver(plain.replace("cuLaunchKernel(", "cuLaunchKernel_v2("))


def test_aotcs_kernels_carry_the_prefix():
    """The launcher picks kernels by name: each of aotc's Triton kernels that waits for its
    predecessor is named with the prefix (the `_` helpers are inlined into them)."""
    pytest.importorskip("triton")
    from aotc.kernels import attention, fused_gemv

    names = {
        kernel.fn.__name__
        for module in (attention, fused_gemv)
        for kernel in vars(module).values()
        if hasattr(kernel, "fn")
        and "PDL" in getattr(kernel, "arg_names", [])
        and not kernel.fn.__name__.startswith("_")
    }
    assert names == {
        "aotc_pdl_attention",
        "aotc_pdl_combine",
        "aotc_pdl_tiled_attention",
        "aotc_pdl_fused_gemv",
    }
