"""int4 weights chosen with calibration: GPTQ (`aotc build --quantize int4-weight-only
--quantize-method gptq`).

Round-to-nearest rounds each weight on its own. GPTQ (Frantar et al., 2022, "GPTQ: Accurate
Post-Training Quantization for Generative Pre-trained Transformers") rounds a layer's input
features one at a time and moves each one's rounding error onto the features not yet rounded, in
the proportions that keep the layer's outputs on real activations closest: it minimises
|X W^T - X W_q^T| over the calibration activations X, through the inverse of H = X^T X. It runs
on two grids of each layer's groups, scales and zeros in the dtype the int4 kernels take: the
min-to-max ranges, and those ranges clipped where that lowers each group's error weighted by its
features' squared activations (H's diagonal); the layer keeps the one with the lower output
error. A calibrated package is stored, multiplied and checked exactly as a round-to-nearest one
is; only the grids and levels differ.

The activations come from the float program itself (the artifact's step), run on the
calibration text that ships with aotc (calibration_text.txt: docstrings of Python's standard
library), tokenized by the tokenizer the artifact carries. Input features are taken in order of
decreasing activation energy ("act-order"), with the groups' grids fixed beforehand ("static
groups"), as the paper's reference implementation does for large groups.
"""

from __future__ import annotations

from pathlib import Path

CALIBRATION_TEXT = Path(__file__).with_name("calibration_text.txt")
CALIBRATION_TOKENS = 8192  # enough for a 135M model's Hessians (docs/quantization.md)
CHUNK_TOKENS = 512  # tokens per call of the step, at most
DAMPING = 0.01  # of H's mean diagonal, added to its diagonal: keeps the inverse stable
COLUMN_BLOCK = 128  # input features updated together (the paper's lazy batch updates)
# The Hessians held at once: each distinct product input's K x K fp32. Past this, the
# calibration runs again for the next products (a 1B model's fit in one pass).
HESSIAN_BUDGET_BYTES = 4 << 30


def chunk_length(signature: dict, max_seq_len: int) -> int:
    """Tokens per calibration call: CHUNK_TOKENS, or fewer where the step or its cache takes fewer."""
    dims = signature.get("dims", {})
    tokens = _input(signature, "input_ids")["shape"][0]
    longest = dims.get(tokens, {}).get("max", CHUNK_TOKENS)
    return max(1, min(CHUNK_TOKENS, max_seq_len, longest))


def calibration_for(artifact, meta, tokens: int = CALIBRATION_TOKENS) -> list:
    """The calibration text's first `tokens` token ids in step-sized chunks, tokenized by the
    artifact's own tokenizer (`meta`: its metadata); or the one-line refusal of a model that is
    not a language model or carries no tokenizer."""
    from pathlib import Path

    from aotc.errors import UserInputError
    from aotc.export.artifact import read_artifact_tokenizer

    if not meta.task or meta.task.get("name") != "text-generation":
        raise UserInputError(
            "--quantize-method gptq calibrates a language model on text: export the model with "
            "--task text-generation, or leave the option out"
        )
    tokenizer = read_artifact_tokenizer(Path(artifact))
    if tokenizer is None:
        raise UserInputError(
            f"--quantize-method gptq needs the model's tokenizer, and {artifact} carries none: "
            "export it again with --tokenizer FOLDER (or from a model folder), or leave the "
            "option out"
        )
    chunk = chunk_length(meta.signature, meta.task["max_seq_len"])
    return calibration_chunks(tokenizer, tokens, chunk)


def calibration_chunks(tokenizer_json: str, max_tokens: int, chunk: int) -> list:
    """The calibration text's token ids, at most `max_tokens`, in chunks of at most `chunk`."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_str(tokenizer_json).encode(CALIBRATION_TEXT.read_text()).ids
    ids = ids[:max_tokens]
    return [ids[i : i + chunk] for i in range(0, len(ids), chunk)]


def step_calls(signature: dict, example: list, chunks: list) -> list:
    """A text-generation step's arguments that feed each chunk to row 0 from position 0. All
    calls share one copy of the example's state: a chunk writes its positions before it reads
    them, and never reads the later positions an earlier chunk left (one cache, not one per call:
    a large model's cache is GiBs)."""
    import torch

    state = [s.clone() for s in example[len(signature["inputs"]) :]]
    picks = _input(signature, "picks")["shape"][0]
    rows = picks if isinstance(picks, int) else 1  # a static batch of picks, else one
    calls = []
    for chunk in chunks:
        t = len(chunk)
        feed = {
            "input_ids": torch.tensor(chunk, dtype=torch.int64),
            "rows": torch.zeros(t, dtype=torch.int64),
            "positions": torch.arange(t, dtype=torch.int64),
            "picks": torch.full((rows,), t - 1, dtype=torch.int64),
        }
        device = example[0].device
        inputs = [feed[spec["name"]].to(device) for spec in signature["inputs"]]
        calls.append(inputs + state)
    return calls


def _input(signature: dict, name: str) -> dict:
    return next(spec for spec in signature["inputs"] if spec["name"] == name)


def product_inputs(module, linear_names: list) -> dict:
    """linear node name -> the node whose rows are its input features. A product fed the rows a
    step picks (the output layer after `index`) is calibrated on all the rows it picks from."""
    import torch

    index = torch.ops.aten.index.Tensor
    nodes = {n.name: n for n in module.graph.nodes}
    found = {}
    for name in linear_names:
        source = nodes[name].args[0]
        while getattr(source, "target", None) is index:
            source = source.args[0]
        found[name] = source.name
    return found


def hessians(module, calls: list, wanted: set) -> dict:
    """Node name -> X^T X (fp32, K x K) of that node's output rows over the calls, for the nodes
    in `wanted`, from eager runs of `module` (an unlifted GraphModule)."""
    import torch

    sums: dict = {}
    outer = {n for n in module.graph.nodes if n.name in wanted}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if n in outer:
                x = result.detach().float().reshape(-1, result.shape[-1])
                sums[n.name] = sums.get(n.name, 0) + x.t() @ x
            return result

    with torch.no_grad():
        for call in calls:
            Recorder(module).run(*call)
    return sums


def gptq_levels(weight, hessian, group: int, grid_dtype):
    """(levels [N, K] 0-15, scale, zero [N, K/group] in grid_dtype) of `weight` [N, K], chosen by
    GPTQ against `hessian` [K, K] on each of two grids, keeping the one whose levels give the
    layer the lower output error on the calibration (tr(E H E^T), E the weight's error): the
    groups' min-to-max ranges (quantized_linear.int4_grid), or those ranges clipped by the same
    activations (int4_grid_weighted). Neither wins everywhere: the clipped grids took
    SmolLM2-135M-Instruct's group-64 package from +16.8% to +4.05% perplexity, and made the
    tests' small random Llama's held-out error worse (docs/quantization.md)."""
    import torch

    from aotc.export.quantized_linear import int4_grid, int4_grid_weighted

    prepared = _prepared(hessian)
    exact = hessian.double()
    best = None
    for scale, zero in (
        int4_grid(weight, group, grid_dtype),
        int4_grid_weighted(weight, group, grid_dtype, torch.diag(hessian)),
    ):
        levels = _levels(weight, prepared, scale, zero, group)
        grouped = levels.reshape(weight.shape[0], -1, group)
        rounded = (grouped - 8) * scale.double()[..., None] + zero.double()[..., None]
        error = weight.double() - rounded.reshape(weight.shape)
        loss = float(((error @ exact) * error).sum())
        if best is None or loss < best[0]:
            best = (loss, levels, scale, zero)
    return best[1].to(torch.uint8), best[2], best[3]


def _prepared(hessian) -> tuple:
    """(order, inverse): the input features in act-order, and the upper Cholesky factor of the
    damped H^-1 in that order (row j holds feature j's error spread over the later ones)."""
    import torch

    k = hessian.shape[0]
    h = hessian.double().clone()
    dead = torch.diag(h) == 0  # a feature no calibration token used: its weight is never read
    h[dead, dead] = 1
    order = torch.argsort(torch.diag(h), descending=True)  # act-order
    h = h[order][:, order]
    h += DAMPING * torch.mean(torch.diag(h)) * torch.eye(k, dtype=h.dtype, device=h.device)
    inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    return order, inverse


def _levels(weight, prepared: tuple, scale, zero, group: int):
    """GPTQ's levels [N, K] (float) of `weight` on the grid (scale, zero)."""
    import torch

    order, inverse = prepared
    n, k = weight.shape
    w = weight.double()[:, order].clone()
    group_of = order // group
    col_scale, col_zero = scale.double()[:, group_of], zero.double()[:, group_of]
    levels = torch.zeros_like(w)
    for b0 in range(0, k, COLUMN_BLOCK):
        b1 = min(b0 + COLUMN_BLOCK, k)
        block, inv = w[:, b0:b1].clone(), inverse[b0:b1, b0:b1]
        errors = torch.zeros(n, b1 - b0, dtype=w.dtype, device=w.device)
        for j in range(b1 - b0):
            column, s, z = block[:, j], col_scale[:, b0 + j], col_zero[:, b0 + j]
            level = torch.round((column - z) / s + 8).clamp(0, 15)
            levels[:, b0 + j] = level
            error = (column - ((level - 8) * s + z)) / inv[j, j]
            block[:, j:] -= error[:, None] * inv[j, j:][None, :]
            errors[:, j] = error
        w[:, b1:] -= errors @ inverse[b0:b1, b1:]
    chosen = torch.empty_like(levels)
    chosen[:, order] = levels
    return chosen


def calibrate(module, calls: list, weights: dict, group: int, grid_dtype) -> dict:
    """weight target -> gptq_levels, for `weights` (target -> (float weight, names of the linear
    nodes in `module` that read it)). The Hessians are gathered in passes over the calls, as many
    products' at a time as HESSIAN_BUDGET_BYTES holds."""
    inputs = product_inputs(module, [name for _, names in weights.values() for name in names])
    pending = list(weights.items())
    chosen: dict = {}
    while pending:
        taken, sources, held = [], set(), 0
        for target, (weight, names) in pending:
            new = {inputs[name] for name in names} - sources
            size = 4 * weight.shape[1] ** 2 * len(new)
            if taken and held + size > HESSIAN_BUDGET_BYTES:
                break
            taken.append((target, weight, names))
            sources |= new
            held += size
        pending = pending[len(taken) :]
        sums = hessians(module, calls, sources)
        for target, weight, names in taken:
            h = sum(sums[s] for s in {inputs[name] for name in names})
            chosen[target] = gptq_levels(weight.float(), h, group, grid_dtype)
    return chosen
