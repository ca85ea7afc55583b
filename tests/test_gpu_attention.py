"""aotc's CUDA attention kernel (aotc/kernels/attention.py) against the reference it replaces
(aotc/export/cached_attention.py) and its CPU reference split the same ways
(aotc/kernels/split_attention.py): packed tokens of rows at different positions, a prefill chunk
beside decode tokens, a token that is no row's, grouped heads, a sliding window, soft-capping, a
head size that is not a power of two; the split count the op picks, one span (no second kernel),
and two spans, combined by a second kernel or by the last span to finish (folded). Then the tiled
kernel on join steps (tests/join_steps.py): chunks of 1 to 300 tokens at several positions beside
other rows' chunks and decode tokens, blocks across two rows, a block of tokens that are no row's,
against the reference and against every token served per token; and a step captured in a CUDA
graph, replayed with tokens that tile other blocks."""

from __future__ import annotations

import pytest
import torch
from join_steps import JOINS, LENGTH, join_step

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize(
    "splits, fold",
    [(None, False), (1, False), (2, False), (2, True), (8, True)],
    ids=["op", "one-span", "two-spans", "two-spans-folded", "eight-spans-folded"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "heads, kv_heads, dim, steps, window, softcap",
    [(4, 4, 64, 1, 0, 0.0), (32, 8, 64, 1, 0, 0.0), (16, 8, 128, 7, 0, 0.0), (8, 2, 80, 5, 6, 0.0),
     (4, 2, 16, 3, 0, 50.0), (4, 1, 64, 130, 0, 0.0)],
)  # fmt: skip
def test_the_kernel_attends_as_the_reference(
    heads, kv_heads, dim, steps, window, softcap, dtype, splits, fold
):
    from aotc.export.cached_attention import prefix, reference
    from aotc.kernels.attention import attend  # also registers the kernel's op
    from aotc.kernels.split_attention import split_attention, split_count
    from aotc_runtime.decode_step import pack

    def kernel(*args):  # the op (its own split count), or the kernel split `splits` ways
        if splits is None:
            return torch.ops.aotc.cached_attention_cuda(*args)
        return attend(*args, splits, fold=fold)  # folded: the last span combines

    g = torch.Generator(device="cuda").manual_seed(0)
    batch, length = 4, 300
    cache = (batch, length + 1, kv_heads, dim)
    keys = torch.randn(cache, generator=g, device="cuda").to(dtype)
    values = torch.randn(cache, generator=g, device="cuda").to(dtype)
    # row 0 a chunk at the cache's start, row 1 a decode token, row 2 a chunk at the cache's end,
    # row 3 a token that is no row's
    feeds = [(0, 0, [0] * steps), (1, 40, [0]), (2, length - steps, [0] * steps), (3, length, [0])]
    _ids, rows, positions, _picks = (t.cuda() for t in pack(feeds))
    tokens = rows.shape[0]
    # a query strided as a fused projection leaves it: [1, T, Hq, D] seen as [1, Hq, T, D]
    query = torch.randn(1, tokens, heads, dim, generator=g, device="cuda").to(dtype)
    query = query.transpose(1, 2)
    args = (query, keys, values, rows, positions, dim**-0.5, window, softcap)
    got = kernel(*args)
    want = reference(*args)
    tolerance = 2e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)
    assert not got[0, -1].any()  # the token that is no row's: 0
    # the CPU's windows (prefix), on the GPU's inputs
    torch.testing.assert_close(prefix(*args).float(), want.float(), atol=tolerance, rtol=tolerance)
    # and to its CPU reference, split the same ways (aotc/kernels/split_attention.py)
    ways = splits if splits is not None else split_count(batch, heads)
    on_cpu = [t.cpu() if isinstance(t, torch.Tensor) else t for t in args]
    torch.testing.assert_close(
        got.float().cpu(),
        split_attention(*on_cpu, ways).float(),
        atol=tolerance,
        rtol=tolerance,
    )


TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 3e-2, torch.float16: 3e-2}


def tiled_or_not(args, splits, block_m=None):
    """The op (its own split count), or the kernel split `splits` ways; `block_m` 0: every token
    per token (no tiled kernel)."""
    from aotc.kernels.attention import attend  # also registers the kernel's op
    from aotc.kernels.split_attention import BLOCK_M

    if splits is None and block_m is None:
        return torch.ops.aotc.cached_attention_cuda(*args)
    return attend(*args, splits or 1, block_m=BLOCK_M if block_m is None else block_m)


@needs_cuda
@pytest.mark.parametrize("splits", [None, 2], ids=["op", "two-spans"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "heads, kv_heads, dim, window, softcap",
    [(12, 12, 64, 0, 0.0), (32, 8, 64, 0, 0.0), (16, 8, 128, 0, 0.0), (8, 2, 128, 40, 0.0),
     (4, 2, 80, 70, 30.0), (4, 1, 256, 100, 0.0)],
    ids=["gpt2", "llama-gqa", "qwen3-128", "window-40", "window-softcap-80", "dim-256"],
)  # fmt: skip
@pytest.mark.parametrize("chunk, start, before, tiled", JOINS)
def test_the_tiled_blocks_attend_as_the_reference(
    chunk, start, before, tiled, heads, kv_heads, dim, window, softcap, dtype, splits
):
    """A window of 40 starts past a query's first key block where the keys' block is shorter
    than the queries' (fp32 at dim 128: 32 keys): that query has seen nothing yet."""
    from aotc.export.cached_attention import reference

    step = join_step(chunk, start, before, heads, kv_heads, dim, dtype, "cuda")
    args = (*step, dim**-0.5, window, softcap)
    got = tiled_or_not(args, splits)
    tolerance = TOLERANCE[dtype]
    want = reference(*args)
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)
    assert not got[0, step[4] >= LENGTH].any()  # the tokens that are no row's: 0
    per_token = tiled_or_not(args, splits or 1, block_m=0)
    torch.testing.assert_close(got.float(), per_token.float(), atol=tolerance, rtol=tolerance)


@needs_cuda
@pytest.mark.parametrize("splits", [1, 4])
def test_a_captured_step_tiles_what_each_replay_feeds(splits):
    """The grids depend on the token count alone and the kernels decide on the device: a step
    captured in a CUDA graph while it tiles nothing, replayed with 264 tokens whose first three
    blocks are one row's chunk, attends as the reference."""
    from aotc.export.cached_attention import reference
    from aotc_runtime.decode_step import pack

    query, keys, values, rows, positions = join_step(65, 31, 3, 8, 2, 64, torch.bfloat16, "cuda")
    args = (query, keys, values, rows, positions, 0.125, 0, 0.0)
    tiled_or_not(args, splits)  # compiles outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = tiled_or_not(args, splits)
    _ids, new_rows, new_positions, _picks = pack([(0, 10, [0] * 200), (2, 100, [0] * 64)])
    assert new_rows.shape == rows.shape
    rows.copy_(new_rows)
    positions.copy_(new_positions)
    graph.replay()
    want = reference(*args)
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


@needs_cuda
def test_a_compiled_package_tiles_steps_of_other_token_counts(tmp_path):
    """AOTInductor compiles the op's three kernels with the token count dynamic (the tiled
    kernel's grid is its blocks, a size of T): traced at 264 tokens that tile nothing, the package
    attends as the reference at 529 tokens with four tiled blocks and at 197 with none."""
    from aotc.compiler.toolchain import compiler_options, use_compiler
    from aotc.export.cached_attention import reference
    from aotc.kernels.attention import OP  # also registers the kernel's op

    op = getattr(torch.ops.aotc, OP.split("::")[1])

    class Attention(torch.nn.Module):
        def forward(self, query, keys, values, rows, positions):
            return op(query.transpose(1, 2), keys, values, rows, positions, 0.125, 0, 0.0)

    def inputs(chunk, start, before):
        query, *cache = join_step(chunk, start, before, 8, 2, 64, torch.bfloat16, "cuda")
        return (query.transpose(1, 2).contiguous(), *cache)  # [1, T, Hq, D], as a projection

    tokens = torch.export.Dim("T", min=2, max=2048)
    dims = ({1: tokens}, None, None, {0: tokens}, {0: tokens})
    program = torch.export.export(Attention(), inputs(65, 31, 3), dynamic_shapes=dims)
    # compiled with the g++ aotc's builds use: one beside another libstdc++ than torch's makes a
    # package that crashes on load (aotc/compiler/toolchain.py)
    options, _record = compiler_options(bsymbolic=True)
    with use_compiler(options["cpp.cxx"][1]):
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp_path / "a.pt2"), inductor_configs=options
        )
    package = torch._inductor.aoti_load_package(path)
    for join in [(300, 90, 33), (1, 0, 0)]:
        step = inputs(*join)
        want = reference(step[0].transpose(1, 2), *step[1:], 0.125, 0, 0.0)
        got = package(*step)
        torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
