"""Text generation timed: a package's greedy generation against transformers' `generate`, in one process.

The contenders, all from the same weights, generate greedily after one prompt of random ids and
stop at no end-of-sequence token (every run makes exactly the tokens asked for):

  package         the package, through `Package.stream` (one CPU tensor a step)
  eager           transformers' `generate` (its default dynamic cache)
  static-compile  transformers' `generate` with cache_implementation="static" and the model's
                  forward under torch.compile(fullgraph=True; mode reduce-overhead on CUDA, default
                  on CPU); if it raises, its row holds the error's first line and the others go on
  gpt-fast        a gpt-fast-style hand-written decoder of the Llama family on the same weights,
                  its decode step compiled whole (aotc/bench/gpt_fast.py); asked for by name
                  (`--against gpt-fast`); a model it is not written for costs only its row. For
                  an int4-weight-only package its weights are int4 too, in gpt-fast's int4 form
                  (torch's tinygemm) and the package's group size: the quantized contender

Every token's arrival on the host is time-stamped (transformers' through a streamer). That gives
the time to first token (prefill and first sample; the median over rounds) and the gaps between
tokens of every round: their p50 and p99, the decode rate 1000 / p50 (the headline, and "vs
eager" is the ratio of the p50s), and the mean rate (tokens 2..N over their time, stalls
included). The headline is the median, not the mean: on a machine with other work, or with more
CPU threads than free cores, a few gaps of hundreds of ms (a thread descheduled at an OpenMP
barrier) make the mean of a fast contender equal a slow one's (seen: "1.01x" with p50s of 2.2
against 10.5 ms); the mean column and a line under the table show such stalls instead of hiding
them. Rounds interleave the contenders (the order rotates, so drift hits all alike). Each
contender's tokens are compared with the package's.

On CUDA also: the package's GPU memory (peak while it loads and generates once, before any
transformers model exists, beside its weights and full KV cache) and, given the device's copy
bandwidth, decode as a fraction of the memory-bandwidth floor (a decode token reads every weight
and the KV cache so far once, so no implementation beats bandwidth / those bytes).

`aotc bench` on a text-generation package calls `measure` (aotc/bench/generation_bench.py: its
options, the model, the report); so does scripts/generate_bench.py on the packages it builds.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aotc.errors import AotcError, AotcRuntimeError, BuildError, ModelError
from aotc.export.user_frames import first_line

PACKAGE = "package"
BASELINES = ("eager", "static-compile", "gpt-fast")  # what --against takes
DEFAULT_BASELINES = ("eager", "static-compile")
# baselines whose failure (a compiler's crash, an architecture not covered) costs only their row
MAY_FAIL = ("static-compile", "gpt-fast")
# static-compile's untimed generations before its warm-up: the compile (prefill and decode
# shapes), then on CUDA the recording of its graphs
COMPILE_WARMUP = 2
MB = 1e6  # sizes are reported in MB (10^6 bytes)


@dataclass(frozen=True)
class GenerationBench:
    """What `measure` times."""

    package: Path
    model: tuple | None  # load_model's (target, entry) of transformers' model; None: no baselines
    against: tuple  # baselines, of BASELINES, in the order of the rows
    device: str  # "cpu" or "cuda"
    precision: str  # the package's: fp32, tf32, bf16, fp16
    prompt_tokens: int
    new_tokens: int
    rounds: int
    warmup: int  # untimed generations of each contender before the rounds
    seed: int = 0  # of the prompt's ids
    bandwidth_bytes_per_s: float | None = None  # CUDA: the copy bandwidth, for the floor
    # the artifact the package was built from: the baselines take its weights (an export with
    # --weights traced trained weights that the model file alone would not give them)
    artifact: Path | None = None


@dataclass
class Timed:
    """One generation: the prompt and new tokens (CPU), when it began, each new token's arrival."""

    tokens: Any
    began: float
    stamps: list


@dataclass
class Measured:
    samples: dict  # contender -> [Timed], one a round
    errors: dict = field(default_factory=dict)  # contender -> its error's first line


class Clock:
    """A transformers streamer that time-stamps each new token as `generate` hands it to the host
    (it copies each step's tokens to the CPU before `put`: the stamp is after the step's kernels)."""

    def __init__(self) -> None:
        self.stamps: list = []
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:  # generate puts the prompt first
            self.prompt_seen = True
            return
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)[:300]}"


def torch_dtype(precision: str) -> Any:
    """The dtype transformers' model runs in for a package of this precision (tf32: float32)."""
    import torch

    from aotc.config import Precision
    from aotc.math_mode import REDUCED

    return getattr(torch, REDUCED.get(Precision(precision), "float32"))


def artifact_weights(artifact: Path) -> dict:
    """The weights the artifact's program holds, by their names in the program (which wraps the
    model: "model.transformer.h.0..." for the model's "transformer.h.0...")."""
    from aotc.export.artifact import load_artifact

    ep, _meta = load_artifact(artifact)
    return {name: t.detach() for name, t in ep.state_dict.items()}


def with_weights(module: Any, weights: dict) -> None:
    """Load the program's `weights` into the transformers `module` it was traced from, matching a
    program name to the model's name it ends with; refuse one that matches nothing."""
    from aotc.export.sibling_linears import unstacked

    shapes = {name: t.shape for name, t in module.state_dict().items()}
    own = set(shapes)

    def own_name(name: str) -> str:
        parts = name.split(".")
        for i in range(len(parts)):
            if ".".join(parts[i:]) in own:
                return ".".join(parts[i:])
        raise ValueError(f"the artifact's weight {name} is not a weight of the model file's model")

    # the export stacked sibling linears' weights: split back by the model's own rows
    weights = unstacked(weights, lambda name: shapes[own_name(name)][0])
    module.load_state_dict({own_name(n): t for n, t in weights.items()}, strict=False)


def transformers_model(
    source: tuple, device: str, dtype: Any, compiled: bool = False, weights: dict | None = None
) -> Any:
    """The model `aotc export` traced, constructed as it constructs it (load_model seeds 0 before
    get_model(): a randomly initialised model gets the package's weights), on the device in the
    dtype, set to generate as the package does. `compiled`: transformers' recipe for a fast
    `generate` (with cache_implementation="static"), a fresh instance so eager stays eager."""
    import torch

    from aotc.export.loading import load_model

    module: Any = load_model(*source).module
    if weights is not None:
        with_weights(module, weights)
    model = module.to(device, dtype)
    config = model.generation_config
    # the package is asked for no end-of-sequence token (eos_token_ids=[]): transformers must not
    # stop at one either, nor suppress it (min_new_tokens would), or the tokens would differ
    config.eos_token_id = None
    # a KV cache, as the package has: a config saying use_cache=False (the zoo's, for plain
    # export) would time transformers recomputing the whole sequence at every token
    config.use_cache = True
    if compiled:
        # its own automatic compile of the decode step (CUDA, static cache) off: this one is timed
        config.disable_compile = True
        mode = "reduce-overhead" if device == "cuda" else "default"
        model.forward = torch.compile(model.forward, mode=mode, fullgraph=True)
    return model


def contender_runs(package: Any, models: dict, ids: Any, device: str) -> dict:
    """name -> a function of n running one greedy generation of n new tokens, returning Timed.
    gpt-fast's cache is as long as the package's, so both read as many positions a step."""
    import torch

    def ours(n: int) -> Timed:
        sync(device)
        began, stamps, steps = time.perf_counter(), [], []
        # each step is yielded as a CPU tensor: the yield is after the step's device work
        for step in package.stream(ids, max_new_tokens=n, eos_token_ids=[]):
            stamps.append(time.perf_counter())
            steps.append(step)
        return Timed(torch.cat([ids, torch.stack(steps, 1)], 1), began, stamps)

    device_ids = ids.to(device)  # int64, as transformers expects
    mask = torch.ones_like(device_ids)

    def transformers_run(model: Any, **extra: Any) -> Callable[[int], Timed]:
        def run(n: int) -> Timed:
            clock = Clock()
            sync(device)
            began = time.perf_counter()
            with torch.no_grad():
                out = model.generate(
                    device_ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                    pad_token_id=0, streamer=clock, **extra,
                )  # fmt: skip
            return Timed(out.cpu(), began, clock.stamps)

        return run

    runs: dict = {PACKAGE: ours}
    if "eager" in models:
        runs["eager"] = transformers_run(models["eager"])
    if "static-compile" in models:
        runs["static-compile"] = transformers_run(
            models["static-compile"], cache_implementation="static"
        )
    if "gpt-fast" in models:
        max_len = package.manifest.generation.max_seq_len
        runs["gpt-fast"] = gpt_fast_run(
            models["gpt-fast"], ids, device, max_len, gpt_fast_int4_group(package.manifest)
        )
    return runs


def gpt_fast_int4_group(manifest: Any) -> int | None:
    """The group size of an int4-weight-only package (its gpt-fast contender is int4 too), else
    None. gpt-fast's int8 mode is not a contender: in torch 2.11 its cast weight times scales ran
    at 0.12x its bf16 (docs/quantization.md)."""
    record = manifest.quantization or {}
    return record.get("group_size") if record.get("scheme") == "int4-weight-only" else None


def gpt_fast_run(
    model: Any, ids: Any, device: str, max_len: int, int4_group: int | None = None
) -> Callable[[int], Timed]:
    """The gpt-fast-style decoder on `model`'s weights with a cache of `max_len` positions (int4
    in groups of `int4_group` when given), made at its first generation (so that a model it is not
    written for fails its row, not the bench)."""
    from aotc.bench.gpt_fast import GptFastDecoder

    decoders: list = []

    def run(n: int) -> Timed:
        if not decoders:
            decoders.append(GptFastDecoder(model, max_len, compiled=True, int4_group=int4_group))
        stamps: list = []
        sync(device)
        began = time.perf_counter()
        tokens = decoders[0].generate(ids, n, lambda: stamps.append(time.perf_counter()))
        return Timed(tokens, began, stamps)

    return run


def measure_rounds(runs: dict, new: int, rounds: int, warmup: int, bar: Any = None) -> Measured:
    """Each contender's warm-up, then `rounds` interleaved rounds of one generation each.

    static-compile's exceptions cost only its row (a known crash on some versions: "accessing
    tensor output of CUDAGraphs that has been overwritten by a subsequent run"); the package's and
    eager's stop the bench."""
    measured = Measured({name: [] for name in runs})
    step = bar.step if bar is not None else lambda label, weight=1: None

    def attempt(name: str) -> bool:
        try:
            done = runs[name](new)
        except (AotcError, AotcRuntimeError):
            raise
        except Exception as exc:
            if name not in MAY_FAIL:
                raise contender_error(name, exc) from exc
            measured.errors[name] = one_line(exc)
            measured.samples.pop(name, None)
            return False
        measured.samples[name].append(done)
        return True

    for name in runs:
        extra = COMPILE_WARMUP if name in MAY_FAIL else 0
        for index in range(warmup + extra):
            step(f"warm-up {index + 1}/{warmup + extra}: {name}")
            if not attempt(name):
                break
        if name in measured.samples:
            measured.samples[name].clear()
    for index in range(rounds):
        names = list(measured.samples)
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            step(f"timed round {index + 1}/{rounds}: {name}")
            if name in measured.samples:
                attempt(name)
    return measured


def contender_error(name: str, exc: Exception) -> AotcError:
    if name == PACKAGE:
        return BuildError(
            f"the package fails to generate: {one_line(exc)}; rebuild it with `aotc build --force`"
        )
    return ModelError(
        f"transformers' generate fails on the model ({name}): {one_line(exc)}; leave {name} out "
        "of --against"
    )


def summarize(timed: list, new: int) -> dict:
    """The median over rounds of the first-token time; the gaps between tokens of every round
    summarized as `aotc generate` and `aotc run` summarize theirs (aotc_runtime.summarize: the
    median, and nearest-rank percentiles), so the same data prints the same p99 everywhere; the
    decode rate from their median, and the mean rate over all of them. (`new`, the tokens a round
    asked for, is not needed: the stamps count the tokens that came.)"""
    from aotc_runtime import summarize as summarize_samples
    from aotc_runtime.timing import gaps_ms

    firsts, gaps = [], []
    for run in timed:
        firsts.append(run.stamps[0] - run.began)
        gaps += gaps_ms(run.stamps)
    spread = summarize_samples(gaps)
    return {
        "first_token_ms": round(statistics.median(firsts) * 1e3, 3),
        # the typical token's rate: what the p50 column says, as a rate
        "decode_tokens_per_s": round(1e3 / max(spread["median_ms"], 1e-6), 1),
        # every token 2..N over the time they took, stalls included
        "decode_mean_tokens_per_s": round(1e3 * len(gaps) / sum(gaps), 1),
        "inter_token_ms": {
            "p50": round(spread["median_ms"], 3),
            "p99": round(spread["p99_ms"], 3),
        },
    }


def new_tokens_differ_at(ours: Any, theirs: Any, prompt: int) -> int | None:
    """Index of the first new token where two outputs differ; None if they are equal."""
    a, b = ours[0, prompt:].tolist(), theirs[0, prompt:].tolist()
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def result_rows(names: tuple, measured: Measured, prompt: int, new: int) -> list:
    """One row per contender: its figures or its error, whether its tokens equal the package's,
    and its decode speed over eager's: eager's p50 per token over its own, the columns the table
    prints (so "vs eager" is what the p50 column says)."""
    ours = measured.samples[PACKAGE][-1].tokens
    rows = []
    for name in names:
        if name in measured.errors:
            rows.append({"contender": name, "error": measured.errors[name]})
            continue
        timed = measured.samples[name]
        row = {"contender": name, **summarize(timed, new), "tokens_equal": None}
        if name != PACKAGE:
            at = new_tokens_differ_at(ours, timed[-1].tokens, prompt)
            row["tokens_equal"] = at is None
            if at is not None:  # low-precision argmax ties on random weights flip tokens
                row["first_different_token"] = at
        rows.append(row)
    eager = next((r for r in rows if r["contender"] == "eager" and "error" not in r), None)
    for row in rows:
        if "error" not in row:
            row["decode_speedup_vs_eager"] = (
                round(eager["inter_token_ms"]["p50"] / row["inter_token_ms"]["p50"], 2)
                if eager is not None and row["inter_token_ms"]["p50"] > 0
                else None
            )
    return rows


STALL_RATIO = 0.67  # a mean rate under 2/3 of the median's: gaps far above the typical one


def stalled(row: dict) -> bool:
    """Whether a contender's mean rate is well under its typical token's: a few long gaps
    (other work on the machine, more CPU threads than free cores) cost it most of its time."""
    mean = row.get("decode_mean_tokens_per_s")
    return (
        "error" not in row and mean is not None and mean < STALL_RATIO * row["decode_tokens_per_s"]
    )


def copy_bandwidth() -> float:
    """Device memory bandwidth in bytes/s: a 1 GiB device-to-device copy (read + write), median
    of 20, timed with CUDA events (no host sync overhead inside the interval)."""
    import torch

    size = 1 << 30
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    seconds = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * size / statistics.median(seconds)


def weight_bytes(model: Any) -> int:
    """Bytes of the model's parameters, each storage once (tied embeddings are one matrix, read
    once per token by the LM head)."""
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    return sum(storages.values())


def kv_bytes_per_position(model: Any, rows: int) -> int:
    """Bytes of K and V, every layer, for one position of `rows` sequences."""
    from aotc.export.text_generation import cache_shape

    heads, head_dim = cache_shape(model)
    layers = model.config.get_text_config().num_hidden_layers
    return 2 * layers * heads * head_dim * rows * model.dtype.itemsize


def bandwidth_floor(spec: GenerationBench, weights: int, kv_position: int, rows: list) -> dict:
    # the average decode step attends over prompt + new / 2 positions (steps feed positions
    # prompt .. prompt + new - 2, each reading the cache up to and including its own)
    bandwidth = spec.bandwidth_bytes_per_s or 0.0
    per_token = weights + kv_position * (spec.prompt_tokens + spec.new_tokens / 2)
    floor = bandwidth / per_token
    return {
        "bandwidth_gb_s": round(bandwidth / 1e9, 1),
        "bytes_per_token_mb": round(per_token / MB, 2),
        "floor_tokens_per_s": round(floor, 1),
        "fraction": {
            r["contender"]: round(r["decode_tokens_per_s"] / floor, 3)
            for r in rows
            if "error" not in r
        },
    }


def measure(spec: GenerationBench, bar: Any = None) -> dict:
    """Time the package and its baselines: {"load_s", "results": [rows], "memory" (CUDA, else
    None), "bandwidth_floor" (with spec.bandwidth_bytes_per_s and a baseline)}."""
    import torch

    import aotc_runtime

    cuda = spec.device == "cuda"
    step = bar.step if bar is not None else lambda label, weight=1: None
    # The package loads and generates once (its warm-up: CUDA graphs captured) before any
    # transformers model exists: the peak below is the package's alone. The driver's count
    # (mem_get_info) is there too because AOTInductor may cudaMalloc its constants (the weights)
    # outside PyTorch's allocator, which max_memory_allocated does not see.
    memory: dict = {}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        free_before = torch.cuda.mem_get_info()[0]
    step(f"loading {PACKAGE}")
    started = time.perf_counter()
    package = aotc_runtime.load(spec.package)
    load_s = time.perf_counter() - started
    generation = package.manifest.generation
    generator = torch.Generator().manual_seed(spec.seed)
    ids = torch.randint(0, generation.vocab_size, (1, spec.prompt_tokens), generator=generator)
    for _ in package.stream(ids, max_new_tokens=spec.new_tokens, eos_token_ids=[]):
        pass
    if cuda:
        torch.cuda.synchronize()
        memory["peak_allocated_mb"] = round(torch.cuda.max_memory_allocated() / MB, 1)
        memory["peak_reserved_mb"] = round(torch.cuda.max_memory_reserved() / MB, 1)
        memory["device_used_mb"] = round((free_before - torch.cuda.mem_get_info()[0]) / MB, 1)

    models = {}
    if spec.against and spec.model is None:
        raise ValueError("GenerationBench: baselines need `model`, the model file to load")
    weights = artifact_weights(spec.artifact) if spec.against and spec.artifact else None
    for name in spec.against:
        step(f"loading {name}")
        models[name] = transformers_model(
            spec.model or (),
            spec.device,
            torch_dtype(spec.precision),
            name == "static-compile",
            weights,
        )
    runs = contender_runs(package, models, ids, spec.device)
    measured = measure_rounds(runs, spec.new_tokens, spec.rounds, spec.warmup, bar)
    rows = result_rows((PACKAGE, *spec.against), measured, spec.prompt_tokens, spec.new_tokens)
    result = {"load_s": round(load_s, 3), "results": rows, "memory": memory or None}
    sized = next(iter(models.values()), None)  # every baseline has the package's weights
    if cuda and sized is not None:
        memory["weights_mb"] = round(weight_bytes(sized) / MB, 2)
        full_cache = generation.batch_size * generation.max_seq_len
        memory["kv_cache_mb"] = round(kv_bytes_per_position(sized, full_cache) / MB, 2)
        if spec.bandwidth_bytes_per_s:
            result["bandwidth_floor"] = bandwidth_floor(
                spec, weight_bytes(sized), kv_bytes_per_position(sized, 1), rows
            )
    # free this package's and models' memory before whatever comes next (another measure's peak
    # must not include ours)
    del runs, models, sized, measured, package
    gc.collect()
    if set(MAY_FAIL) & set(spec.against):
        torch._dynamo.reset()  # compiled code and CUDA-graph pools
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return result
