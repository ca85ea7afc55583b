"""`aotc build --quantize`: the graph pass that stores a program's linear weights quantized.

It runs on the module the build re-exports (placement.place_program), after the precision passes.
Every weight that only linear layers and embeddings read is replaced by its quantized tensors
(quantized_linear.py), registered as buffers, so AOTInductor stores those and not the float weight:
on disk and in the device's memory. Each `aten.linear` on it becomes the scheme's product for the
device, each `aten.embedding` a gather of quantized rows. A weight shared by an embedding and the
output layer (tied embeddings) is stored once where both read the same form (int8 rows; int4
groups on the CPU).

Quantizing at build, not at export: one exported artifact gives a package per scheme and device,
the way --precision does, and the kernels and layouts (tinygemm's tiles on CUDA, the CPU's
reduction form) are the build device's to choose. The artifact stays the float model, which is
also what the build checks the quantized package against.

Each layer's quantization error is measured on the activations the model's example inputs give it:
|x W_q^T - x W^T| / |x W^T| over the layer's outputs, against a bound per scheme (ERROR_BOUNDS);
a layer over it fails the build naming the layer, before anything is compiled.
"""

from __future__ import annotations

from aotc.errors import NumericMismatchError, UserInputError
from aotc.export import quantized_linear as ql
from aotc.quantize_schemes import (
    BF16_ACTIVATIONS,
    DEFAULT_GROUP_SIZE,
    ERROR_BOUNDS,
    GROUP_SIZES,
    Quantization,
)


def quantize_graph(
    module,
    quantization: Quantization,
    device: str,
    dtype,
    inputs: dict,
    emulate=False,
    chosen_by=None,
    groups_product=False,
):
    """Quantize the linear weights of `module` (an unlifted GraphModule, in `dtype` on `device`)
    in place, filling quantization.layers and .kept. `inputs`: linear_inputs of the float program
    (by node name), for each layer's error. `emulate`: the build's reference instead of the
    package: the same stored tensors, dequantized and multiplied in fp32 by eager PyTorch; it
    measures no errors (the package's build did, on the same weights). `chosen_by`: (the float
    program, its calibration calls) for a calibrated method (gptq.py), which fills
    quantization.calibrated; the reference takes the levels from there. `groups_product`: CUDA
    int4 stored as aotc's int4 groups and multiplied by aotc's kernel (cuda_int4_groups_linear),
    the form the fused products take in (fused_products.py), instead of tinygemm's tiles."""
    graph = module.graph
    weights = _weight_uses(module)
    if not any(uses["linear"] for uses in weights.values()):
        raise UserInputError(
            f"--quantize {quantization.scheme}: the model has no linear layers to quantize; "
            "build it without --quantize"
        )
    chosen = {}
    outputs = _output_layers(graph)
    for target, uses in weights.items():
        name = target.removesuffix(".weight")
        if not uses["linear"]:
            continue
        weight = module.get_parameter(target)
        why = _kept_because(name, uses, weight, quantization, device, outputs)
        if why:
            quantization.kept.append({"name": name, "why": why})
        else:
            chosen[target] = uses
    forms = Forms(
        quantization.scheme, quantization.group_size, device, dtype, emulate, groups_product
    )
    reference = Forms(quantization.scheme, quantization.group_size, device, dtype, emulate=True)
    if chosen_by is not None:
        quantization.calibrated = _calibrated(module, chosen, chosen_by, forms)
    for index, (target, uses) in enumerate(chosen.items()):
        name = target.removesuffix(".weight")
        weight = module.get_parameter(target).detach()
        levels = quantization.calibrated.get(target)
        stored = forms.pack(weight, with_embedding=bool(uses["embedding"]), levels=levels)
        if emulate:  # the reference computes in fp32: its scales too (rounded as the package's)
            stored = {k: _widened(t) for k, t in stored.items()}
        if not emulate:  # the reference's weights are the package's, whose errors were measured
            error = _layer_error(
                weight,
                reference.pack(weight, False, levels),
                reference,
                [inputs.get(n.name) for n in uses["linear"]],
            )
            quantization.layers.append(
                {"name": name, "shape": list(weight.shape), "error": round(error, 5)}
            )
        attrs = {}
        for key, tensor in stored.items():
            attr = f"quantized__{index}__{key}"
            module.register_buffer(attr, tensor)
            attrs[key] = attr
        for node in uses["linear"]:
            _replace(graph, node, forms.linear_call(attrs, node, node in outputs))
        for node in uses["embedding"]:
            _replace(graph, node, forms.embedding_call(attrs, node))
        for node in uses["nodes"]:
            graph.erase_node(node)
        _delete_parameter(module, target)
    _check_errors(quantization)
    graph.lint()
    module.recompile()


def _calibrated(module, chosen: dict, chosen_by: tuple, forms: Forms) -> dict:
    """gptq.calibrate's levels for the chosen weights, as the base-precision package holds them,
    on the grid the int4 kernels take (bf16 scales and zeros)."""
    import torch

    from aotc.export.gptq import calibrate

    float_module, calls = chosen_by
    weights = {
        target: (
            module.get_parameter(target).detach().to(forms.dtype),
            [n.name for n in uses["linear"]],
        )
        for target, uses in chosen.items()
    }
    return calibrate(float_module, calls, weights, forms.group, torch.bfloat16)


# fp8 keeps a model's output layer (a language model's lm_head, tied to its embedding or not) in
# the base precision, as vLLM's and llm-compressor's fp8 recipes leave out lm_head: the logits are
# where fp8's rounding costs most. SmolLM2-135M-Instruct's perplexity rose 1.60% with it in fp8
# (block scales) and 0.67% without (docs/quantization.md).
FP8_OUTPUT_LAYER = (
    "the output layer: fp8 keeps it in the base precision (its rounding costs the logits most)"
)


def _output_layers(graph) -> set:
    """The linear nodes whose result becomes one of the program's outputs through steps of one
    input each (a cast, a pick of rows, a soft-cap): a language model's output layer."""
    import torch

    found: set = set()
    results: list = []
    output = next(node for node in graph.nodes if node.op == "output")
    torch.fx.node.map_arg(output.args, results.append)
    for node in results:
        while node.op == "call_function" and node.target is not torch.ops.aten.linear.default:
            inputs = node.all_input_nodes
            if len(inputs) != 1:
                break
            node = inputs[0]
        if node.op == "call_function" and node.target is torch.ops.aten.linear.default:
            found.add(node)
    return found


def _weight_uses(module) -> dict:
    """weight target -> {"linear": [nodes], "embedding": [nodes], "other": n, "nodes": [get_attr]}
    for every 2-D floating parameter the graph reads."""
    import torch

    aten = torch.ops.aten
    uses: dict = {}
    params = dict(module.named_parameters())
    for node in module.graph.nodes:
        if node.op != "get_attr" or node.target not in params:
            continue
        param = params[node.target]
        if param.dim() != 2 or not param.is_floating_point():
            continue
        entry = uses.setdefault(
            node.target, {"linear": [], "embedding": [], "other": 0, "nodes": []}
        )
        entry["nodes"].append(node)
        for user in node.users:
            if (
                user.target is aten.linear.default
                and user.args[1] is node
                and user.args[0] is not node
            ):
                entry["linear"].append(user)
            elif user.target is aten.embedding.default and user.args[0] is node:
                entry["embedding"].append(user)
            else:
                entry["other"] += 1
    return uses


def _kept_because(
    name: str, uses: dict, weight, quantization: Quantization, device: str, outputs: set
) -> str:
    """Why the layer stays in the base precision ("" when it is quantized). `outputs`: the
    program's output layers (_output_layers)."""
    hit = next((s for s in quantization.skip if s in name), None)
    if hit:
        return f"--quantize-skip {hit}"
    if uses["other"]:
        return "its weight is read by an operation other than a linear layer or an embedding"
    n_out, k_in = weight.shape
    scheme = quantization.scheme
    if scheme == "int4-weight-only":
        group = quantization.group_size
        if k_in % group:
            fits = [g for g in GROUP_SIZES if k_in % g == 0]
            instead = f"use --group-size {max(fits)}" if fits else "no group size divides it"
            raise UserInputError(
                f"--group-size {group} does not divide the {k_in} input features of {name}; "
                f"{instead}, or keep the layer with --quantize-skip {name.rsplit('.', 1)[-1]}"
            )
        if device == "cuda" and (n_out % 8 or k_in % 32):
            return (
                f"tinygemm needs out features divisible by 8 and in features by 32 ({n_out}x{k_in})"
            )
        if device == "cpu" and (n_out % 16 or k_in % 32):
            return (
                "torch's CPU int4 kernel needs out features divisible by 16 and in features by 32 "
                f"({n_out}x{k_in})"
            )
    if scheme == "fp8":
        output_layer = FP8_OUTPUT_LAYER if outputs.intersection(uses["linear"]) else ""
        return fp8_refusal(n_out, k_in) or output_layer
    return ""


def fp8_refusal(n_out: int, k_in: int) -> str:
    """Why fp8 leaves an [n_out, k_in] weight in the base precision ("" where it takes it)."""
    if n_out % 16 or k_in % 16:
        return f"fp8 tensor cores need both sizes divisible by 16 ({n_out}x{k_in})"
    return ""


def linear_inputs(module, example) -> dict:
    """linear node name -> the input (rows x features) the float program `module` (an unlifted
    GraphModule) gives it on `example`, from one eager run. Run before the program is cast: a
    program traced in fp32 and cast to bf16 holds fp32 casts that eager bf16 refuses (tracing
    does not), and the error is measured against the float weights anyway."""
    import torch

    linear = torch.ops.aten.linear.default
    wanted = {n.args[0]: n.name for n in module.graph.nodes if n.target is linear}
    seen: dict = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if n in wanted and isinstance(result, torch.Tensor):
                seen[wanted[n]] = result.detach().reshape(-1, result.shape[-1])
            return result

    with torch.no_grad():
        Recorder(module).run(*[t.clone() for t in example])
    return seen


def _layer_error(weight, stored: dict, forms: Forms, inputs: list) -> float:
    """The largest |x W_q^T - x W^T| / |x W^T| (Frobenius) over the layer's example inputs."""
    import torch

    worst = 0.0
    with torch.no_grad():
        for x in inputs:
            if x is None or x.numel() == 0:
                continue
            x = x.float()
            want = x @ weight.float().t()
            got = forms.emulated_product(x, stored)
            scale = float(want.norm())
            if not torch.isfinite(got).all():
                return float("inf")
            worst = max(worst, float((got - want).norm()) / scale if scale else 0.0)
    return worst


def _widened(tensor):
    import torch

    return tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor


def _check_errors(quantization: Quantization) -> None:
    bound = ERROR_BOUNDS[quantization.scheme]
    bad = [layer for layer in quantization.layers if not layer["error"] <= bound]
    if bad:
        worst = max(bad, key=lambda layer: layer["error"])
        leaf = worst["name"].rsplit(".", 1)[-1]
        raise NumericMismatchError(
            f"--quantize {quantization.scheme} breaks layer {worst['name']}: its outputs on the "
            f"example inputs differ by {worst['error']:.3g} (relative), above the scheme's bound "
            f"{bound}; keep it with --quantize-skip {leaf}, or choose a finer scheme"
        )


def _replace(graph, old, new_args) -> None:
    function, args = new_args
    with graph.inserting_before(old):
        attrs = [graph.get_attr(a) if isinstance(a, _Attr) else a for a in args]
        new = graph.call_function(function, tuple(attrs))
    new.meta = dict(old.meta)
    old.replace_all_uses_with(new)
    graph.erase_node(old)


def _delete_parameter(module, target: str) -> None:
    owner_name, _, leaf = target.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    del owner._parameters[leaf]


class _Attr(str):
    """A buffer name in a call's arguments: becomes a get_attr node."""


class Forms:
    """One scheme on one device: how a weight is stored, multiplied and gathered."""

    def __init__(
        self,
        scheme: str,
        group_size: int | None,
        device: str,
        dtype,
        emulate: bool,
        groups_product: bool = False,
    ):
        self.scheme = scheme
        self.group = group_size or DEFAULT_GROUP_SIZE
        self.device = device
        self.dtype = dtype
        self.emulate = emulate
        # CUDA int4 in aotc's groups and kernel, not tinygemm's tiles (quantize_graph)
        self.groups_product = groups_product and device == "cuda" and scheme == "int4-weight-only"

    def pack(self, weight, with_embedding: bool, levels=None) -> dict:
        """The stored tensors of `weight`. `levels`: int4's (levels, scale, zero) where a
        calibrated method (gptq.py) chose them."""
        import torch

        w = weight.to(self.dtype)  # what the base-precision package would hold
        if self.scheme in ("int8-weight-only", "int8-dynamic"):
            # the CPU's int8 kernel takes its rows' scales in bf16: quantized on them, for the
            # package and its reference alike
            bf16 = (self.scheme, self.device) in BF16_ACTIVATIONS
            q, scale = ql.int8_rows(w, torch.bfloat16 if bf16 else self.dtype)
            stored = {"q": q, "scale": scale}
            if self.scheme == "int8-dynamic":
                stored["q_t"] = q.t().contiguous()
                if not with_embedding:
                    del stored["q"]
            return stored
        if self.scheme == "fp8":
            q, scale = ql.fp8_blocks(w)
            stored = {"q": q, "scale": scale}
            if with_embedding:
                stored["rows_q"], stored["rows_scale"] = ql.int8_rows(w, self.dtype)
            return stored
        if self.device == "cpu":
            # the CPU kernel takes its groups' scales and zeros in bf16: quantized on that grid,
            # for the package and its reference alike
            packed, scale_zero = ql.int4_groups(w, self.group, torch.bfloat16, levels)
            stored = {"packed": packed, "scale_zero": scale_zero}
            if not self.emulate:
                tiles, tile_scale_zero = ql.int4_cpu_tiles(packed, scale_zero)
                stored = {"cpu_tiles": tiles, "cpu_scale_zero": tile_scale_zero}
                if with_embedding:
                    stored.update(packed=packed, scale_zero=scale_zero)
            return stored
        packed, scale_zero = ql.int4_groups(w, self.group, self.dtype, levels)
        stored = {"packed": packed, "scale_zero": scale_zero}
        if self.device == "cuda" and not self.emulate and not self.groups_product:
            tiles, tile_scale_zero = ql.int4_tinygemm(w, self.group, levels)
            stored = {"tiles": tiles, "tile_scale_zero": tile_scale_zero}
            if with_embedding:
                stored.update(packed=packed, scale_zero=scale_zero)
        return stored

    def emulated_product(self, x, stored: dict):
        """x [M, K] (fp32) times the stored weight, as the package means it, in fp32."""
        import torch

        if self.scheme == "int8-dynamic":
            return ql.int8_dynamic_emulated(x, stored["q_t"], stored["scale"])
        return torch.nn.functional.linear(x, self.dequantized(stored))

    def dequantized(self, stored: dict):
        if self.scheme == "fp8":
            return ql.fp8_blocks_dequantized(stored["q"], stored["scale"])
        if "q" in stored and self.scheme == "int8-weight-only":
            return ql.int8_rows_dequantized(stored["q"], stored["scale"])
        if "packed" in stored:
            return ql.int4_groups_dequantized(stored["packed"], stored["scale_zero"], self.group)
        raise AssertionError(f"no dequantized form stored for {self.scheme}")

    def linear_call(self, attrs: dict, node, output_layer: bool = False):
        """(function, args) that replaces the linear `node`; `output_layer`: the program's output
        layer (_output_layers), whose product on the CPU keeps the activations' dtype."""
        x, bias = node.args[0], (node.args[2] if len(node.args) > 2 else None)
        a = {k: _Attr(v) for k, v in attrs.items()}
        # the CPU's int8 output layer is not the kernel's: see cpu_int8_output_linear
        int8_output = self.scheme == "int8-weight-only" and self.device == "cpu" and output_layer
        if self.emulate:
            keys = {
                "int8-weight-only": ("q", "scale"),
                "int4-weight-only": ("packed", "scale_zero"),
                "fp8": ("q", "scale"),
                "int8-dynamic": ("q_t", "scale"),
            }[self.scheme]
            # the CPU's int4 and int8 kernels multiply bf16 activations into a bf16 product
            rounds = (self.scheme, self.device) in BF16_ACTIVATIONS and not int8_output
            args = (x, *(a[k] for k in keys), bias, self.scheme, self.group, rounds)
            return emulated_linear, args
        if int8_output:
            return cpu_int8_output_linear, (x, a["q"], a["scale"], bias)
        if self.scheme == "int8-weight-only":
            function = cuda_int8_linear if self.device == "cuda" else cpu_int8_linear
            return function, (x, a["q"], a["scale"], bias)
        if self.scheme == "int8-dynamic":
            return dynamic_int8_linear, (x, a["q_t"], a["scale"], bias)
        if self.scheme == "fp8":
            return fp8_linear, (x, a["q"], a["scale"], bias)
        if self.groups_product:
            return cuda_int4_groups_linear, (x, a["packed"], a["scale_zero"], bias, self.group)
        if self.device == "cuda":
            return tinygemm_linear, (x, a["tiles"], a["tile_scale_zero"], bias, self.group)
        return cpu_int4_linear, (x, a["cpu_tiles"], a["cpu_scale_zero"], bias, self.group)

    def embedding_call(self, attrs: dict, node):
        ids = node.args[1]
        a = {k: _Attr(v) for k, v in attrs.items()}
        # the package gathers rows in its own dtype (its scales may be bf16 in an fp32 package);
        # the reference in its widened scales' fp32, the dtype the float program goes on in
        dtype = None if self.emulate else self.dtype
        if "packed" in a:
            return int4_embedding, (a["packed"], a["scale_zero"], ids, self.group, dtype)
        if "rows_q" in a:
            return int8_embedding, (a["rows_q"], a["rows_scale"], ids, dtype)
        return int8_embedding, (a["q"], a["scale"], ids, dtype)


# The products the pass puts into the graph: plain PyTorch over the stored tensors, traced by the
# build's re-export (named functions, with settings as trailing arguments: the graph's code names
# its calls). Each flattens the leading dims, multiplies, and restores them.


def _flat(x):
    return x.reshape(-1, x.shape[-1])


def _finish(x, out, bias):
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


def by_rows(x2, small, large, operands, limit: int = ql.DECODE_ROWS):
    """small(*operands) for at most `limit` rows, large(*operands) for more: decided at export when
    the row count is fixed there, else a cond node AOTInductor compiles to both kernels."""
    import torch

    rows = x2.shape[0]
    if isinstance(rows, int):
        return small(*operands) if rows <= limit else large(*operands)
    # The cond operator itself, not torch.cond: outside torch.compile, torch.cond first traces its
    # branches with Dynamo to vet them (about 1 s a call in a language model's export, 120 calls
    # in SmolLM2's), while the operator traces them with the export's own tracer. The branches
    # are ours, pure and fixed, so the vetting finds nothing.
    return torch.ops.higher_order.cond(rows <= limit, _one(small), _one(large), operands)[0]


def _one(product):
    """`product` returning a one-tuple: a cond node's output is the tuple of its branch's."""
    return lambda *operands: (product(*operands),)


def cpu_int8_linear(x, q, scale, bias):
    # one kernel for every row count, as for int4: torch's int8 kernel beat Inductor's reduction
    # (decode) and the dequantized dense product (prefill) on the 2-core VM
    return _finish(x, ql.int8_cpu_mm(_flat(x), q, scale), bias)


def cpu_int8_output_linear(x, q, scale, bias):
    """The output layer's int8 product on the CPU, in the activations' dtype: torch's int8 kernel
    gives a bf16 product, and a language model's logits rounded to bf16 (steps of 1/16 at 10)
    moved SmolLM2-135M-Instruct's next-token distribution by a tenth of int8's own error (KL 0.0053
    against 0.0048 in fp32). At decode's few rows Inductor's reduction over the int8 bytes, which
    at the output layer's size is also faster than the kernel on the 2-core VM (SmolLM2's package:
    173.9 against 164.8 tokens/s, docs/quantization.md). Above them the kernel, as for the other
    layers: the reduction would read the weight once a row, and a dequantized weight is four times
    its bytes (113 MB for SmolLM2's) made again every call."""
    import torch
    import torch._inductor.inductor_prims  # noqa: F401 (registers prims.inductor_force_stride_order)

    x2 = _flat(x)

    def reduction(x2, q, scale):
        # the activations made once before the reduction: Inductor would otherwise compute what
        # leads to them (the last residual adds, the final norm, the pick of rows) again for each
        # of the output features (49,152 times in SmolLM2: 2.5 ms a step)
        x2 = torch.ops.prims.inductor_force_stride_order(x2, x2.stride())
        return ql.int8_rows_gemv(x2, q, scale.to(x2.dtype))

    return _finish(x, by_rows(x2, reduction, ql.int8_cpu_mm, (x2, q, scale)), bias)


def cpu_int4_linear(x, tiles, scale_zero, bias, group):
    # one kernel for every row count: torch's int4 kernel beat both Inductor's reduction (decode)
    # and the dequantized dense product (prefill, 32 and 256 rows) on the 2-core VM
    return _finish(x, ql.int4_cpu_mm(_flat(x), tiles, scale_zero, group), bias)


def _gemv(x, q, scale):
    # one kernel for every row count, no branch on it (docs/quantization.md): decode reads the
    # weight once, a prefill of R rows R / 16 times
    from aotc.kernels.gemv import rows_gemv

    return rows_gemv(x, q, scale)


def cuda_int8_linear(x, q, scale, bias):
    return _finish(x, _gemv(_flat(x), q, scale), bias)


def fp8_linear(x, q, scale, bias):
    from aotc.kernels.gemv import blocks_gemv

    return _finish(x, blocks_gemv(_flat(x), q, scale), bias)


def tinygemm_linear(x, tiles, scale_zero, bias, group):
    return _finish(x, ql.int4_tinygemm_mm(_flat(x), tiles, scale_zero, group), bias)


def cuda_int4_groups_linear(x, packed, scale_zero, bias, group):
    """int4 groups as aotc stores them (quantized_linear.int4_groups), multiplied by aotc's int4
    kernel at decode's row counts and as dequantized weights above them (and on the CPU, where
    only the fused products' tests run it). fused_products.py takes the norm and residual in."""
    import torch

    x2 = _flat(x)

    def dequantized(x2, packed, scale_zero):
        return int4_groups_dense(x2, packed, scale_zero, group)

    if not x.is_cuda:
        return _finish(x, dequantized(x2, packed, scale_zero), bias)
    import aotc.kernels.fused_gemv  # noqa: F401  (importing it registers the kernel's op)
    from aotc.kernels.product_tiles import MAX_ROWS

    def kernel(x2, packed, scale_zero):
        return torch.ops.aotc.fused_int4_gemv_cuda(
            x2.contiguous(), packed, scale_zero, group, None, None, None, 0.0, False, 0.0, x2.dtype
        )

    operands = (x2, packed, scale_zero)
    return _finish(x, by_rows(x2, kernel, dequantized, operands, limit=MAX_ROWS), bias)


def int4_groups_dense(x, packed, scale_zero, group):
    """x [..., K] times int4 groups dequantized in x's dtype: the int4 groups' product above
    the kernel's row counts (and the fused products' reference)."""
    import torch

    weight = ql.int4_groups_dequantized(packed, scale_zero, group, x.dtype)
    return torch.nn.functional.linear(x, weight)


def dynamic_int8_linear(x, q_t, scale, bias):
    return _finish(x, ql.int8_dynamic_mm(_flat(x), q_t, scale), bias)


def emulated_linear(x, a, b, bias, scheme, group, rounds=False):
    """The reference's product: dequantized weights (and, for int8-dynamic, quantized activations)
    multiplied by eager PyTorch in fp32; `rounds`: the activations and the product rounded to bf16
    as the CPU's int4 kernel rounds them."""
    import torch

    x2 = _flat(x).float()
    if rounds:
        x2 = x2.to(torch.bfloat16).float()
    if scheme == "fp8":
        out = torch.nn.functional.linear(x2, ql.fp8_blocks_dequantized(a, b))
    elif scheme == "int8-dynamic":
        out = ql.int8_dynamic_emulated(x2, a, b)
    elif scheme == "int8-weight-only":
        out = torch.nn.functional.linear(x2, ql.int8_rows_dequantized(a, b))
    else:
        out = torch.nn.functional.linear(x2, ql.int4_groups_dequantized(a, b, group))
    if rounds:
        out = out.to(torch.bfloat16)
    return _finish(x, out.to(x.dtype), bias)


def int8_embedding(q, scale, ids, dtype=None):
    """Rows of an int8-rows weight, dequantized in `dtype` (by default the scales' dtype)."""
    import torch

    dtype = dtype or scale.dtype
    rows = torch.nn.functional.embedding(ids, q)
    return rows.to(dtype) * torch.nn.functional.embedding(ids, scale[:, None]).to(dtype)


def int4_embedding(packed, scale_zero, ids, group, dtype=None):
    """Rows of an int4-groups weight: the packed rows gathered, then dequantized (in `dtype`, by
    default the scales' dtype)."""
    import torch

    n_rows = packed.shape[0]
    rows = torch.nn.functional.embedding(ids, packed)
    rows_scale = torch.nn.functional.embedding(ids, scale_zero.reshape(n_rows, -1))
    flat_rows = rows.reshape(-1, packed.shape[1])
    flat_scale = rows_scale.reshape(flat_rows.shape[0], -1, 2)
    out = ql.int4_groups_dequantized(flat_rows, flat_scale, group, dtype or scale_zero.dtype)
    return out.reshape(*ids.shape, -1)
