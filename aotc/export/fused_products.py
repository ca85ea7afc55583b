"""The graph pass that gives a decode step's weight products their neighbours: each `aten.linear`
takes the RMSNorm or the gated activation before it and the residual add after it into one
operation, which a CUDA build with `--fused-products` runs as one kernel at decode's row counts
(aotc/kernels/fused_gemv.py) and as the unfused operations above them.

It runs on the module a build re-exports (placement.place_program), after the precision and
quantization passes, on the patterns they leave; a pattern is matched by what it computes, not by
a model's module names, so every family that writes it is fused:

- the RMSNorm in front of a product, as transformers writes it: `x32 = x.to(float32)`, `x32 *
  rsqrt(mean(x32 ** 2, -1, keepdim) + eps)`, cast to float32 (a program exported in fp32) or
  back to the model's bf16 or fp16 (one exported in that dtype), times the norm's weight; also when
  rows are picked between the norm and the product (the output layer reads the final norm's rows
  whose logits a step returns): the norm is per row, so the pass picks the rows first and the
  output layer takes the norm in as every other product does;
- the LayerNorm in front of a product (aten.layer_norm over the last dimension, with its weight
  and bias), as GPT-2 and the other LayerNorm families write it; also through a view that keeps
  its shape (GPT-2's final norm) and across picked rows, as the RMSNorm;
- the gated MLP's `silu(gate) * up`, where gate and up are the two halves of one stacked product
  (sibling_linears.py stacks them at export), or transformers' gelu_new as GPT-2 and phi write it
  out (0.5 x (1 + tanh(...)), seven ops);
- the clamp and cast to the weight's dtype a reduced-precision build puts before a product
  (reduced_precision.py), or the cast alone where there is nothing to clamp (a program exported
  in bf16);
- the residual add of the product's only user, `residual + product` (an eval program's dropouts,
  the identity, are removed first).

GPT-2's products are `Conv1D`s: addmm over a weight stored input-major, between views. Each whose
weight it alone reads becomes an aten.linear over the weight transposed once at build (the layout
the kernel reads), and is then matched as any other.

The products are float linears (`aten.linear`), int8-weight-only ones (quantization.py's
`cuda_int8_linear`: int8 rows and a scale per output feature), whose fused kernel multiplies the
int8 weights as they are stored and scales each output feature's sum, fp8 ones (`fp8_linear`: a
scale per output feature and block of input features, applied inside the sum), and
int4-weight-only ones stored as aotc's int4 groups (quantization.py's `cuda_int4_groups_linear`,
the form a build with --fused-products stores), multiplied by the int4 kernel.

Every node it removes had the product (or the next node of the pattern) as its only user, so
nothing else in the graph changes. `reference` is the unfused computation, step by step with the
same roundings: it is what the CPU and the row counts above the kernel's run, and what the tests
hold the kernel and the pass to.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch

from aotc.export.graph_match import dims, erase_unused, is_view
from aotc.export.graph_match import is_attr as _is_attr
from aotc.export.graph_match import is_call as _is
from aotc.export.graph_match import users as _users
from aotc.export.linear_products import addmm_as_linear

aten = torch.ops.aten


@dataclass
class Fusions:
    """How many products took each neighbour (one product can take a prologue and a residual)."""

    norm: int = 0
    gated: int = 0
    residual: int = 0
    gelu: int = 0

    def total(self) -> int:
        return self.norm + self.gated + self.residual + self.gelu

    def describe(self) -> str:
        return (
            f"fused {self.norm} products with their norm, {self.gated + self.gelu} with their "
            f"activation and {self.residual} with their residual add (aotc's kernels at decode)"
        )


def gelu_new(x):
    """transformers' gelu_new (GPT-2's and phi's activation) as it writes it, op for op."""
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def reference(
    x, weight, bias, norm_weight, residual, eps: float, gated: bool, clamp: float,
    scale=None, operand_dtype=None, group: int = 0, norm_bias=None, layer_norm: bool = False,
    gelu: bool = False, norm_rounded: bool = False, norm_upcast: bool = False,
):  # fmt: skip
    """The unfused computation: x [..., K] (or [..., 2K], gate then up, when `gated`); with
    `scale`, `weight` is int8 rows (or with `group`, int4 groups whose scales and zeros `scale`
    holds) and the product takes the activations in `operand_dtype`. `layer_norm`: the norm is
    aten.layer_norm with `norm_bias`, not an RMSNorm; `gelu`: gelu_new before it;
    `norm_rounded`: the RMSNorm's scaled row is cast to its weight's dtype before the weight
    multiplies it (transformers' RMSNorm in a bf16 or fp16 model); `norm_upcast`: x is the
    half-precision residual stream, which the RMSNorm casts to fp32 first (the kernels load every
    activation as fp32 anyway, so the cast is theirs, not a kernel of its own)."""
    a = x.float() if norm_upcast else x
    if gated:
        gate, up = a.chunk(2, dim=-1)
        a = torch.nn.functional.silu(gate) * up
    if gelu:
        a = gelu_new(a)
    if norm_weight is not None and layer_norm:
        a = torch.nn.functional.layer_norm(a, (a.shape[-1],), norm_weight, norm_bias, eps)
    elif norm_weight is not None:
        scaled = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps)
        a = norm_weight * (scaled.to(norm_weight.dtype) if norm_rounded else scaled)
    if clamp:
        a = a.clamp(-clamp, clamp)
    if scale is None:
        y = torch.nn.functional.linear(a.to(weight.dtype), weight, bias)
    else:  # the unfused quantized product (quantization.py's), on the operand as it is cast
        from aotc.export import quantization

        a = a.to(operand_dtype)
        if group:  # int4 groups, dequantized in the operand's dtype
            y = quantization.int4_groups_dense(a, weight, scale, group)
        elif weight.dtype == torch.float8_e4m3fn:
            y = quantization.fp8_linear(a, weight, scale, None)
        else:
            y = quantization.cuda_int8_linear(a, weight, scale, None)
        y = y if bias is None else y + bias
    return y if residual is None else residual + y


def fused_linear(
    x, weight, bias, norm_weight, residual, eps: float, gated: bool, clamp: float,
    scale=None, operand_dtype=None, group: int = 0, norm_bias=None, layer_norm: bool = False,
    gelu: bool = False, norm_rounded: bool = False, norm_upcast: bool = False,
):  # fmt: skip
    """What a fused node computes: on CUDA at up to MAX_ROWS rows aotc's kernel, else `reference`
    (decided at export when the row count is fixed there, else a cond node AOTInductor compiles to
    both)."""
    settings = (eps, gated, clamp)
    shape = {
        "layer_norm": layer_norm, "gelu": gelu, "norm_rounded": norm_rounded,
        "norm_upcast": norm_upcast,  # `reference`'s alone: the kernels load any row as fp32
    }  # fmt: skip
    if not x.is_cuda:
        return reference(
            x, weight, bias, norm_weight, residual, *settings, scale, operand_dtype, group,
            norm_bias, **shape,
        )  # fmt: skip
    import aotc.kernels.fused_gemv  # noqa: F401  (importing it registers aotc::fused_gemv_cuda)
    from aotc.export.quantization import by_rows
    from aotc.kernels.product_tiles import MAX_ROWS

    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    n_out = weight.shape[0]  # int4 groups: [N, K/2] bytes
    r2 = None if residual is None else residual.reshape(-1, n_out).contiguous()
    present = [t for t in (bias, norm_weight, r2, scale, norm_bias) if t is not None]
    product_dtype = operand_dtype or weight.dtype

    def unpack(tensors):
        it = iter(tensors)
        return [None if t is None else next(it) for t in (bias, norm_weight, r2, scale, norm_bias)]

    def small(x2, weight, *rest):
        b, nw, r, sc, nb = unpack(rest)
        if group:  # the pass gives int4 products an RMSNorm or the gated activation only
            return torch.ops.aotc.fused_int4_gemv_cuda(
                x2, weight, sc, group, b, nw, r, eps, gated, clamp, product_dtype, norm_rounded
            )
        return torch.ops.aotc.fused_gemv_cuda(
            x2, weight, b, nw, r, eps, gated, clamp, sc, product_dtype, nb, layer_norm, gelu,
            norm_rounded,
        )  # fmt: skip

    def large(x2, weight, *rest):
        b, nw, r, sc, nb = unpack(rest)
        return reference(x2, weight, b, nw, r, *settings, sc, operand_dtype, group, nb, **shape)

    operands = (x2, weight, *present)
    return by_rows(x2, small, large, operands, limit=MAX_ROWS).reshape(*lead, n_out)


def fuse_products(module) -> Fusions:
    """Fuse the products of `module` (an unlifted GraphModule) in place; what was fused."""
    from aotc.export.quantization import cuda_int4_groups_linear, cuda_int8_linear, fp8_linear

    graph = module.graph
    fusions = Fusions()
    rewritten = _drop_eval_dropouts(graph) + addmm_as_linear(module)
    quantized = (cuda_int8_linear, fp8_linear, cuda_int4_groups_linear)
    products = [
        n for n in graph.nodes if _is(n, aten.linear.default) or any(_is(n, q) for q in quantized)
    ]
    for node in products:
        group = 0
        if node.target in quantized:  # the stored form, its scales, its operand's dtype
            x, weight, scale, bias = node.args[:4]
            if node.target is cuda_int4_groups_linear:
                group = node.args[4]
            operand_dtype = _dtype_of(x)
            if operand_dtype not in (torch.bfloat16, torch.float16, torch.float32):
                continue
        else:
            x, weight, bias = (list(node.args) + [None])[:3]
            scale, operand_dtype = None, None
        doomed: list = []
        a, clamp = _cast_and_clamp(x, doomed, operand_dtype or _attr_dtype(module, weight))
        picked, rows = _picked_rows(a)
        before_norm = len(doomed)
        norm = _rms_norm(picked, doomed, module)
        layer = False
        rounded = False
        if norm is not None:
            rounded = norm[3]
            norm = (*norm[:2], None, norm[2])  # (input, weight, no bias, eps)
        elif not group:  # int4 products take an RMSNorm only
            norm = _layer_norm(picked, doomed)
            layer = norm is not None
        if norm is None:
            rows = None
        elif rows is not None:
            doomed.insert(before_norm, a)  # the pick goes before the norm it read
        gate_up = _gated(a, doomed) if norm is None else None
        gelu_of = _gelu_new(a, doomed) if norm is None and gate_up is None and not group else None
        shape: dict = {}
        if norm is not None:
            a, norm_weight, norm_bias, eps = norm
            if layer:
                shape.update(norm_bias=norm_bias, layer_norm=True)
            if rounded:
                shape["norm_rounded"] = True
            if not layer and _half_upcast(a):
                # the norm's cast of a half-precision residual stream to fp32: the kernel loads
                # the activations as fp32 itself, where the cast alone was a kernel a product
                doomed.append(a)
                a = a.args[0]
                shape["norm_upcast"] = True
            fusions.norm += 1
        else:
            norm_weight, eps = None, 0.0
        if gate_up is not None:
            a = gate_up
            fusions.gated += 1
        if gelu_of is not None:
            a = gelu_of
            shape["gelu"] = True
            fusions.gelu += 1
        residual, replaced = None, node
        users = _users(node)
        if len(users) == 1 and _is(users[0], aten.add.Tensor) and _plain_add(users[0]):
            add = users[0]
            other = add.args[1] if add.args[0] is node else add.args[0]
            if isinstance(other, torch.fx.Node) and other is not node:
                residual, replaced = other, add
                fusions.residual += 1
        if norm is None and gate_up is None and gelu_of is None and residual is None:
            continue  # nothing to take in: cuBLAS alone does it
        with graph.inserting_before(replaced):
            if rows is not None:  # the rows picked from the norm's input instead of its output
                a = graph.call_function(aten.index.Tensor, (a, rows))
            fused = graph.call_function(
                fused_linear,
                (a, weight, bias, norm_weight, residual, eps, gate_up is not None, clamp)
                + ((scale, operand_dtype, group) if scale is not None else ()),
                shape,
            )
        fused.meta = dict(replaced.meta)
        replaced.replace_all_uses_with(fused)
        graph.erase_node(replaced)
        if replaced is not node:
            graph.erase_node(node)
        erase_unused(graph, doomed)  # from the product back towards the inputs
    if fusions.total() or rewritten:
        graph.lint()
        module.recompile()
    return fusions


def _half_upcast(node) -> bool:
    """Whether `node` casts a bf16 or fp16 value to fp32."""
    return (
        _is(node, aten.to.dtype)
        and node.args[1] is torch.float32
        and _dtype_of(node.args[0]) in (torch.bfloat16, torch.float16)
    )


def _dtype_of(node):
    """The dtype of a node's value: a cast's target (the precision passes add casts with no
    traced value), else its traced value's (None if it has none)."""
    if _is(node, aten.to.dtype):
        return node.args[1]
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return getattr(value, "dtype", None)


def _attr_dtype(module, node):
    """The dtype of the module attribute `node` reads (the tensor itself: a build casts weights
    after export, so the traced value may name another dtype), else of its traced value."""
    if not _is_attr(node):
        return _dtype_of(node)
    value = module
    for name in node.target.split("."):
        value = getattr(value, name, None)
    return getattr(value, "dtype", None)


def _only_user(node, user) -> bool:
    return isinstance(node, torch.fx.Node) and _users(node) == [user]


def _plain_add(add) -> bool:
    return len(add.args) == 2 and add.kwargs.get("alpha", 1) == 1


def _picked_rows(a) -> tuple:
    """(the node `a` picks rows of, the pick's indices) if `a` is an `aten.index` over leading
    dimensions only (each row's features untouched) and the only user of its source, else (a,
    None)."""
    if _is(a, aten.index.Tensor) and len(_users(a)) == 1:
        source, indices = a.args
        value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if value is not None and len(indices) < value.dim() and _only_user(source, a):
            return source, indices
    return a, None


def _cast_and_clamp(x, doomed: list, operand_dtype) -> tuple:
    """(the node before the product's input cast and clamp, the clamp's bound or 0): the cast to
    the weight's dtype and the symmetric clamp reduced_precision.py adds, if both are there; or
    the cast alone (a program exported in bf16 has nothing to clamp), which the product's
    operand rounding does anyway."""
    if (
        _is(x, aten.to.dtype)
        and x.args[1] == operand_dtype
        and len(_users(x)) == 1
        and not _is(x.args[0], aten.clamp.default)
        and isinstance(x.args[0], torch.fx.Node)
    ):
        doomed.append(x)
        return x.args[0], 0.0
    if _is(x, aten.to.dtype) and _is(x.args[0], aten.clamp.default):
        clamp = x.args[0]
        low, high = (list(clamp.args) + [None, None])[1:3]
        if (
            _only_user(clamp, x)
            and isinstance(high, float)
            and low == -high
            and len(_users(x)) == 1
        ):
            doomed += [x, clamp]
            return clamp.args[0], high
    return x, 0.0


def _rms_norm(a, doomed: list, module):
    """(x32, norm weight node, eps, rounded) if `a` is transformers' RMSNorm of x32 times its
    weight and used by the product only, else None. `rounded`: the scaled row is cast to the
    weight's dtype (bf16 or fp16: the model's) before the weight multiplies it, as transformers'
    RMSNorm does in a model exported in that dtype; a cast to float32 (a program exported in
    fp32, built in bf16) changes nothing."""
    if not _is(a, aten.mul.Tensor) or len(_users(a)) != 1:
        return None
    weight, scaled = a.args if _is_attr(a.args[0]) else reversed(a.args)
    if not _is_attr(weight):
        return None
    cast, rounded = None, False
    if _is(scaled, aten.to.dtype) and _only_user(scaled, a):
        to = scaled.args[1]
        rounded = to in (torch.bfloat16, torch.float16) and to == _attr_dtype(module, weight)
        if to is torch.float32 or rounded:
            cast, scaled = scaled, scaled.args[0]
    if not _is(scaled, aten.mul.Tensor) or not _only_user(scaled, cast or a):
        return None
    x32, inverse = scaled.args
    if _is(x32, aten.rsqrt.default):
        x32, inverse = inverse, x32
    if not _is(inverse, aten.rsqrt.default) or not _only_user(inverse, scaled):
        return None
    plus = inverse.args[0]
    if not _is(plus, aten.add.Tensor) or not _only_user(plus, inverse) or not _plain_add(plus):
        return None
    mean, eps = plus.args
    if not isinstance(eps, float) or not _is(mean, aten.mean.dim) or not _only_user(mean, plus):
        return None
    if list(mean.args[1]) != [-1] or not (mean.args[2:] or [mean.kwargs.get("keepdim")])[0]:
        return None
    square = mean.args[0]
    if not _is(square, aten.pow.Tensor_Scalar) or square.args != (x32, 2):
        return None
    if (
        not _only_user(square, mean)
        or not _is(x32, aten.to.dtype)
        or x32.args[1] is not torch.float32
    ):
        return None
    doomed += [a, *([cast] if cast else []), scaled, inverse, plus, mean, square]
    return x32, weight, eps, rounded


def _gated(a, doomed: list):
    """The stacked gate/up product's output if `a` is silu(its first half) * its second half and
    used by the product only, else None."""
    if not _is(a, aten.mul.Tensor) or len(_users(a)) != 1:
        return None
    silu, up = a.args
    if not _is(silu, aten.silu.default) or not _only_user(silu, a):
        return None
    gate = silu.args[0]
    if not (_is(gate, operator.getitem) and _is(up, operator.getitem)):
        return None
    split = gate.args[0]
    if up.args[0] is not split or (gate.args[1], up.args[1]) != (0, 1):
        return None
    if not _is(split, aten.split_with_sizes.default) or len(_users(split)) != 2:
        return None
    sizes = list(split.args[1])
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    if len(sizes) != 2 or sizes[0] != sizes[1] or dim != -1:
        return None
    if not (_only_user(gate, silu) and _only_user(up, a)):
        return None
    doomed += [a, silu, gate, up, split]
    return split.args[0]


def _layer_norm(a, doomed: list):
    """(x, weight, bias or None, eps) if `a` is aten.layer_norm over the last dimension with a
    weight (or a view of it that keeps its shape, as GPT-2's final norm has), used by the product
    only, else None."""
    same_shape = None
    if is_view(a) and len(_users(a)) == 1:
        same_shape, a = a, a.args[0]
        shapes = [n.meta.get("val") for n in (same_shape, a)]
        if any(v is None for v in shapes) or dims(shapes[0].shape) != dims(shapes[1].shape):
            return None
    if not _is(a, aten.layer_norm.default) or len(_users(a)) != 1:
        return None
    x, normalized = a.args[:2]
    weight, bias, eps = (list(a.args[2:5]) + [None, None, 1e-5][len(a.args[2:5]) :])[:3]
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if value is None or list(normalized) != [value.shape[-1]] or not _is_attr(weight):
        return None
    if not (bias is None or _is_attr(bias)) or not isinstance(eps, float):
        return None
    doomed += [same_shape, a] if same_shape is not None else [a]
    return x, weight, bias, eps


def _scalar_operand(node, target, scalar):
    """The tensor operand of `node` if it is `target` (a binary op) of a tensor and `scalar`, in
    either order, else None."""
    if not _is(node, target) or len(node.args) != 2 or node.kwargs:
        return None
    first, second = node.args
    if isinstance(first, torch.fx.Node) and second == scalar and not isinstance(second, bool):
        return first
    if isinstance(second, torch.fx.Node) and first == scalar and not isinstance(first, bool):
        return second
    return None


def _gelu_new(a, doomed: list):
    """The activation's input if `a` is transformers' gelu_new as GPT-2 and phi write it, 0.5 * x
    * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))) (gelu_new computes exactly that), and
    used by the product only, else None."""
    if not _is(a, aten.mul.Tensor) or len(_users(a)) != 1 or len(a.args) != 2:
        return None
    for half, plus in (a.args, tuple(reversed(a.args))):
        x = _scalar_operand(half, aten.mul.Tensor, 0.5)
        tanh = _scalar_operand(plus, aten.add.Tensor, 1.0)
        if x is None or tanh is None or not _is(tanh, aten.tanh.default):
            continue
        inner = _scalar_operand(tanh.args[0], aten.mul.Tensor, _SQRT_2_OVER_PI)
        if not _is(inner, aten.add.Tensor) or not _plain_add(inner) or x not in inner.args:
            continue
        cubed = inner.args[1] if inner.args[0] is x else inner.args[0]
        cube = _scalar_operand(cubed, aten.mul.Tensor, 0.044715)
        if not _is(cube, aten.pow.Tensor_Scalar) or cube.args != (x, 3.0):
            continue
        chain = [half, plus, tanh, tanh.args[0], inner, cubed, cube]
        users = [a, a, plus, tanh, tanh.args[0], inner, cubed]
        if all(_only_user(node, user) for node, user in zip(chain, users)):
            doomed += [a, *chain]
            return x
    return None


def _drop_eval_dropouts(graph) -> int:
    """Remove the dropouts of an eval program (`train` False: the identity), which stand between a
    product and its residual add in GPT-2's layers; how many."""
    dropped = 0
    for node in list(graph.nodes):
        if _is(node, aten.dropout.default):
            train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
            if train is False:
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)
                dropped += 1
    return dropped
