"""Load a package folder and call it like the model it came from.

Loading goes straight to the C++ AOTInductor package loader (torch._C._aoti): no torch._inductor
import, no compilation, no Python-side warm-up, which is what keeps cold start near `import torch`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .environment import check_compatible
from .errors import PackageError
from .extraction import private_extraction
from .generation_gate import GenerationGate
from .manifest import (
    MODEL_FILE,
    STATE_FILE,
    Manifest,
    check_contract,
    check_finished,
    read_manifest,
    verify_files,
)
from .signature import Signature

MAX_ACCEPTED_SIGNATURES = 256  # input (shape, dtype) combinations remembered as already checked


class Package:
    """A loaded package: `Package(*tensors, **named)` runs it; `.manifest` and `.signature` describe it.

    A call returns what the model returned, rebuilt from the signature: a tensor, a tuple or list
    of tensors, or (for dicts, named tuples, dataclasses such as transformers' ModelOutput, and
    nested structures) a dict from output name to tensor. State that forward mutates (a counter, a
    cache) is kept between calls on this Package, as eager keeps it on the module; `reset_state()`
    puts it back to its value at export.

    Threads: a package may be called from several threads at once. Loaded with `threads=N`, N calls
    run in parallel (AOTInductor keeps N model instances); beyond N, calls wait for a free one.
    A package with state, or with CUDA graphs (which replay into static buffers), runs one call at
    a time whatever N. With `reuse_outputs=True` a returned tensor is overwritten by the next call
    from any thread. On CPU, give each of N calling threads cores // N intra-op threads
    (torch.set_num_threads in that thread; aotc_runtime.intra_op_threads(N) computes it).
    """

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        loader: Any,
        reuse_outputs: bool = False,
        initial_state: Sequence[torch.Tensor] = (),
    ):
        self.path = Path(path)
        self.manifest = manifest
        self.signature: Signature = manifest.signature
        self.device = _device_of(manifest)
        self._loader = loader
        self._out_spec = pytree.treespec_loads(loader.get_call_spec()[1])
        self._initial_state = [t.to(self.device) for t in initial_state]
        self._state = [t.clone() for t in self._initial_state]
        self._state_lock = threading.Lock()
        # one generation at a time: the KV cache is the state (decode_engine.py holds it)
        self.generation_gate = GenerationGate()
        self._decode_graph: Any = None  # generation's decode step as CUDA graphs, once made
        self._tokenizer: Any = None
        self._n_outputs = len(self.signature.outputs)
        # The input check runs before every call, and with CUDA-graph replay the rest of a call is a
        # few µs of CPU work: a signature that passed once is remembered, not re-checked dim by dim.
        self._accepted: set = set()
        self._call_flat = self._run_loader
        # Static-shape members (--specialize): [(where each dim is read, its sizes, the member)],
        # and the member (or self) each accepted input signature runs, found once per signature.
        self._members: list = []
        self._routes: dict = {}
        # A tf32 package was checked with TF32 matmuls/convolutions, and the aten kernels it calls read
        # the process-wide flags: they are switched on around its calls (and a CUDA graph's capture)
        # and put back after, so loading one package does not change the user's other models.
        self._tf32 = manifest.runtime.tf32
        self._cudnn_benchmark = manifest.runtime.cudnn_benchmark and self.device.type == "cuda"
        if manifest.runtime.cuda_graphs and self.device.type == "cuda":
            # only CUDA packages built with reduce-overhead need it
            from .cuda_graphs import (
                CudaGraphRunner,
            )

            self._call_flat = CudaGraphRunner(
                self._run_loader,
                self.device,
                reuse_outputs=reuse_outputs,
                # the state inputs a replay writes into its own buffers, copied back to the state
                written_inputs=len(self._state) if self.signature.state_in_place else 0,
            )

    def __call__(self, *args: torch.Tensor, **named: torch.Tensor) -> Any:
        tensors = self.signature.arrange(args, named) if named else list(args)
        try:
            key = tuple((t.shape, t.dtype) for t in tensors)
        except AttributeError:  # not all tensors: the full check names the culprit
            key = None
        if key is None or key not in self._accepted:
            self.signature.check_inputs(tensors)
            if len(self._accepted) < MAX_ACCEPTED_SIGNATURES:
                self._accepted.add(key)
        if self._members:
            target = self._routes.get(key) if key is not None else None
            if target is None:
                target = self.route(*tensors)
                if key is not None and len(self._routes) < MAX_ACCEPTED_SIGNATURES:
                    self._routes[key] = target
            if target is not self:
                return target(*tensors)
        flat = self._placed(tensors)
        if self._state:
            # each call reads the state the previous one left; an open generation owns it
            with self.generation_gate.other_work("a call of the package"), self._state_lock:
                outputs = self._call_with_state(flat, key)
        else:
            with self.run_settings():
                outputs = self._call_flat(flat, key)
        return self._rebuild(outputs)

    def call_without_graphs(self, *tensors: torch.Tensor) -> Any:
        """A call (positional inputs, checked) that is never captured as a CUDA graph: generation's
        prefill, whose prompt length changes from call to call and would otherwise be captured once
        per length."""
        self.signature.check_inputs(list(tensors))
        flat = self._placed(tensors)
        with self._state_lock, self.run_settings():
            outputs = self._run_loader(flat + self._state)
            return self._rebuild(self._keep_state(outputs))

    def _placed(self, tensors: Any) -> list[torch.Tensor]:
        """The inputs on the package's device, contiguous: the compiled model reads each input
        with the strides it was compiled for, so a view such as `tokens[:, 0:1]` would be misread
        (silently: another row's values)."""
        device = self.device
        return [(t if t.device == device else t.to(device)).contiguous() for t in tensors]

    def _call_with_state(self, flat: list[torch.Tensor], key: tuple | None) -> list[torch.Tensor]:
        with self.run_settings():
            outputs = self._call_flat(flat + self._state, key)
        return self._keep_state(outputs)

    def _keep_state(self, outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The model's outputs of a call that was given the state. The program wrote the state's new
        values into the state tensors it was given (signature.state_in_place), or, in packages from
        before that, returned them after the outputs (aotc/export/call_structure.py)."""
        if self._state and not self.signature.state_in_place:
            self._state = list(outputs[self._n_outputs :])
        return list(outputs[: self._n_outputs])

    def run_settings(self) -> contextlib.AbstractContextManager:
        """The process-wide settings this package runs under (TF32 for a tf32 package), as a context
        manager that puts the previous ones back: calls use it, so the user's other models are not affected."""
        if not (self._tf32 or self._cudnn_benchmark):
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        if self._tf32:
            stack.enter_context(_tf32_on())
        if self._cudnn_benchmark:
            # only this flag: torch.backends.cudnn.flags() would also turn TF32 on
            stack.enter_context(_cudnn_benchmark_on())
        return stack

    @property
    def cuda_graphs_captured(self) -> int:
        """CUDA graphs captured so far (one per input signature and member; 0 without CUDA graphs)."""
        own = getattr(self._call_flat, "captured_signatures", 0)
        return own + sum(member.cuda_graphs_captured for *_where, member in self._members)

    @property
    def specializations(self) -> dict:
        """The static-shape members, by their dims ("B=8" -> Package); empty for most packages."""
        return {label: member for label, _where, _sizes, member in self._members}

    def route(self, *tensors: torch.Tensor) -> Package:
        """The model a call with these (positional, checked) inputs runs: the member built for
        their dim sizes, or this package's dynamic model."""
        for _label, where, sizes, member in self._members:
            if all(tensors[i].shape[axis] == size for (i, axis), size in zip(where, sizes)):
                return member
        return self

    def use_cudnn_benchmark(self, enabled: bool) -> None:
        """Time cuDNN's convolution algorithms at the first call per shape (as the manifest's
        runtime.cudnn_benchmark does), whatever the manifest says: `aotc build --tune` times a
        model both ways before it records the faster. Call it before the first call."""
        self._cudnn_benchmark = enabled and self.device.type == "cuda"

    def add_specialization(self, label: str, dims: dict, member: Package) -> None:
        """Dispatch calls whose inputs have these dim sizes to `member` (load() does this)."""
        where = [self.signature.dim_location(name) for name in dims]
        self._members.append((label, where, tuple(dims.values()), member))
        self._routes.clear()

    def generate(
        self,
        input_ids: torch.Tensor | Sequence,  # or lists of token ids (prompts.py)
        attention_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        min_p: float | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        ignore_eos: bool = False,
        stop: str | Sequence[str] = (),
    ) -> torch.Tensor:
        """A text-generation package's prompts followed by their new tokens, as transformers'
        `generate` returns them: greedy with temperature 0 (the default), sampled otherwise (top-k,
        top-p, min-p, a seed for repeatable runs); penalties, `ignore_eos` and `stop` as in
        `stream`. See aotc_runtime/generation.py and sampling.py. `input_ids` may also be lists of
        token ids (prompts.py): `generate([[5, 17, 42]], max_new_tokens=8)`."""
        from .generation import with_prompts
        from .prompts import prompt_tensors

        ids, mask = prompt_tensors(input_ids, attention_mask)
        steps = self.stream(
            ids,
            mask,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            eos_token_ids=eos_token_ids,
            min_p=min_p,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            repetition_penalty=repetition_penalty,
            ignore_eos=ignore_eos,
            stop=stop,
        )
        return with_prompts(ids, steps)

    @property
    def generation(self) -> Any:  # generation_record.Generation
        """A text-generation package's record (batch, cache length, vocabulary, end-of-sequence
        ids); PackageError for any other package."""
        generation = self.manifest.generation
        if generation is None:
            raise PackageError(
                f"package {self.path} is not a text-generation package; export the model with "
                "`aotc export --task text-generation --max-seq-len N` and build that"
            )
        return generation

    @property
    def fixed_picks(self) -> int | None:
        """A text-generation step's count of picked logits when it is fixed (the batch: packages
        of a batch of 1 or 2), None when a step picks as many as it needs."""
        picks = self.signature.inputs[3].shape[0]
        return picks if isinstance(picks, int) else None

    def decode_graph(self) -> Any:  # cuda_graphs.DecodeGraph | None
        """A text-generation package's decode step as CUDA graphs (packages built with
        reduce-overhead or max-autotune, on CUDA), made at the first call and kept: its buffers
        and its sampler are what every decode engine on this package decodes with, and its state
        is the package's from then on. None where the package replays no graphs. Call it holding
        `generation_gate` (decode_engine.DecodeEngine does)."""
        if not (
            self.manifest.runtime.cuda_graphs
            and self.device.type == "cuda"
            and self.signature.state_in_place  # the graph replays on the state itself
        ):
            return None
        if self._decode_graph is None:
            from .cuda_graphs import DecodeGraph
            from .decode_step import DecodeStep
            from .sampling import RowSampler

            generation = self.generation
            graph = DecodeGraph(
                self._run_loader,
                self.device,
                DecodeStep(generation.batch_size, generation.max_seq_len, self.device),
                RowSampler(generation.batch_size, generation.vocab_size, self.device),
                self._state,
                self.run_settings,  # TF32 and cuDNN flags choose kernels at capture
            )
            self._state = graph.state  # what a later call of the package continues from
            self._decode_graph = graph
        return self._decode_graph

    @property
    def tokenizer(self) -> Any:
        """A text-generation package's tokenizer (a `tokenizers.Tokenizer`), when it carries one."""
        if self._tokenizer is None:
            from .generation import load_tokenizer

            self._tokenizer = load_tokenizer(self)
        return self._tokenizer

    def stream(
        self,
        input_ids: torch.Tensor | Sequence,  # or lists of token ids (prompts.py)
        attention_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        min_p: float | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        ignore_eos: bool = False,
        logprobs: int | None = None,
        text: bool = False,
        prefix_cache: Any = None,  # prefix_cache.PrefixCache
        stop: str | Sequence[str] = (),
    ) -> Iterator[Any]:
        """`generate`'s new tokens, one step [prompts] at a time as they come. min-p as
        transformers' MinPLogitsWarper, the repetition penalty as its
        RepetitionPenaltyLogitsProcessor (over the prompt and the new tokens), the presence and
        frequency penalties as OpenAI's (-2 to 2, over the new tokens); `ignore_eos` goes on past
        end-of-sequence ids; `logprobs=k` (0 to 20) makes each step a generation.StepLogprobs,
        the new tokens with their log-probabilities and the k most likely tokens'. `text=True`
        (with the package's tokenizer) makes each step a generation.TextStep: the new tokens, the
        text each prompt gains (never half a character) and why a prompt ended, as the decode
        engine made them. `stop` (a string or several, with the package's tokenizer) ends a
        prompt at the token whose text completes one, the text before it kept (as `stop` in
        `aotc serve`). `input_ids` may be lists of token ids, as in `generate`. A `prefix_cache`
        kept across calls (prefix_cache.PrefixCache) feeds a prompt only what follows the start a
        row of the cache already holds (a chat's turns)."""
        from .generation import stream
        from .prompts import prompt_tensors
        from .sampling import Sampling

        ids, mask = prompt_tensors(input_ids, attention_mask)
        # before the stream starts: refused at once (stop strings without one: by the engine,
        # which says what they need)
        reads_text = text or (stop and self.generation.tokenizer is not None)
        tokenizer = self.tokenizer if reads_text else None
        return stream(
            self,
            ids,
            mask,
            max_new_tokens=max_new_tokens,
            sampling=Sampling(
                temperature,
                top_k,
                top_p,
                seed,
                min_p=min_p,
                presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty,
                repetition_penalty=repetition_penalty,
            ),
            eos_token_ids=eos_token_ids,
            ignore_eos=ignore_eos,
            logprobs=logprobs,
            prefix_cache=prefix_cache,
            tokenizer=tokenizer,
            text=text,
            stop=stop,
        )

    def copy_cache_rows(self, source: int, target: int, positions: int) -> None:
        """A text-generation package: row `source`'s first `positions` cache positions copied into
        row `target`, in every layer's keys and values (the state is [batch, positions, heads,
        head dim] per layer). A decode engine's reused prompt prefix (prefix_cache.py), under the
        generation gate the engine holds."""
        if self.manifest.generation is None:  # its state is not a KV cache
            raise PackageError(f"package {self.path} is not a text-generation package")
        with self._state_lock:
            for tensor in self._state:
                tensor[target, :positions].copy_(tensor[source, :positions])

    def reset_state(self) -> None:
        """Put the state forward mutates back to its value at export (a fresh model)."""
        with self.generation_gate.other_work("reset_state()"):
            self._reset_state()

    def _reset_state(self) -> None:
        if not self.signature.state_in_place:
            self._state = [t.clone() for t in self._initial_state]
            return
        # in place: a decode graph replays on these very tensors (generation.decoder)
        for current, initial in zip(self._state, self._initial_state):
            current.copy_(initial)

    def _rebuild(self, outputs: Sequence[torch.Tensor]) -> Any:
        structure = self.signature.output_structure
        if structure == "tensor" or (not structure and self._out_spec.is_leaf()):
            return outputs[0]
        if structure == "tuple":
            return tuple(outputs)
        if structure == "list":
            return list(outputs)
        if structure == "dict":
            return dict(zip(self.signature.output_names, outputs))
        # packages from before output_structure
        return pytree.tree_unflatten(list(outputs), self._out_spec)

    def _run_loader(self, flat: list[torch.Tensor], key: tuple | None = None) -> list[torch.Tensor]:
        return self._loader.run(flat)

    def __repr__(self) -> str:
        return f"Package({str(self.path)!r}, device={self.device}, mode={self.manifest.mode!r})"


@contextlib.contextmanager
def _cudnn_benchmark_on() -> Iterator[None]:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


@contextlib.contextmanager
def _tf32_on() -> Iterator[None]:
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def load(
    path: str | os.PathLike,
    verify: bool = True,
    reuse_outputs: bool = False,
    *,
    threads: int = 1,
    public_key: str | os.PathLike | None = None,
    unfinished: bool = False,
    _shared: tuple[dict, str] | None = None,  # a member's (weights, its folder), from its package
) -> Package:
    """Open a package folder written by `aotc build`.

    Refuses (PackageError) a folder that is not a package, whose files differ from the manifest's
    hashes, or that was built for another torch release, platform or GPU architecture.
    `verify=False` skips only the hash check (for callers that just verified it).
    `reuse_outputs=True` (CUDA-graph packages only) returns the graph's own output buffers instead
    of copies, as torch.compile's reduce-overhead does: faster, but the next call overwrites them,
    so clone what you keep.
    `threads=N` lets N threads call the package at once (AOTInductor keeps N model instances, each
    with its own buffers); with 1, concurrent calls wait for each other.
    `public_key` (an ed25519 public key in PEM, from `aotc keygen`) refuses a package that is not
    signed by its private key or was changed after signing (`aotc sign`).
    `unfinished=True` lets `aotc build` check a package it is still writing (its numeric check is
    pending); every other caller gets a PackageError for such a folder.
    """
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    path = Path(path)
    signed = None
    if public_key is not None:  # before anything in the folder is parsed
        from .signing import verify_signature

        signed = verify_signature(path, public_key)
    manifest = read_manifest(path, signed=signed)
    if not unfinished:  # only `aotc build`'s own check loads a package it has not finished writing
        check_finished(path, manifest)
    check_compatible(manifest, path)
    if verify or signed is not None:  # a signature vouches for the files only through their hashes
        verify_files(path, manifest)
    loader = _open_model(path, manifest, threads)
    try:
        check_contract(path, manifest, loader.get_metadata())
        weights = None
        if _shared is not None:  # a member: its constants are in its package's weights file
            from .shared_weights import point_at_weights

            shared_weights, program = _shared
            point_at_weights(loader, shared_weights, program, path)
        elif manifest.shared_weights is not None:
            from .shared_weights import point_at_weights, read_shared_weights

            weights = read_shared_weights(path, manifest, _device_of(manifest))
            if "." in manifest.shared_weights.programs:
                point_at_weights(loader, weights, ".", path)
    except PackageError:
        loader = None  # its destructor removes what it unpacked, before the error travels up
        raise
    package = Package(
        path,
        manifest,
        loader,
        reuse_outputs=reuse_outputs,
        initial_state=_read_state(path, manifest),
    )
    for spec in manifest.specializations:
        # The package's hashes (checked above) cover the member's files: its own manifest hash,
        # contract and compatibility are still checked as it loads.
        shares = manifest.shared_weights is not None and spec.package in (
            manifest.shared_weights.programs
        )
        member = load(
            path / spec.package,
            verify=False,
            reuse_outputs=reuse_outputs,
            threads=threads,
            unfinished=unfinished,
            _shared=(weights, spec.package) if shares and weights is not None else None,
        )
        check_member(path, manifest, spec, member.manifest)
        package.add_specialization(spec.label, spec.dims, member)
    return package


def _device_of(manifest: Manifest) -> torch.device:
    return torch.device("cuda", 0) if manifest.device.type == "cuda" else torch.device("cpu")


def check_member(path: Path, manifest: Manifest, spec: Any, member: Manifest) -> None:
    """Refuse a member that is not this package's model at its dims' sizes (the first difference)."""
    problems = [
        f"its {name} is {ours} but the package's is {theirs}"
        for name, ours, theirs in (
            ("mode", member.mode, manifest.mode),
            ("precision", member.precision, manifest.precision),
            ("device", member.device.type, manifest.device.type),
        )
        if ours != theirs
    ]
    if member.specializations or member.signature.state:
        problems.append("it has members or state of its own")
    difference = manifest.signature.specialization_difference(
        spec.dims, member.signature.inputs, f"the package's at {spec.label}"
    )
    if difference:
        problems.append(difference)
    if problems:
        raise PackageError(
            f"package {path}: its member {spec.package} ({spec.label}) is not the package's model at "
            f"those sizes: {problems[0]}; rebuild it with `aotc build --force`"
        )


def _open_model(path: Path, manifest: Manifest, threads: int) -> Any:
    """The compiled model behind the loader interface Package calls, for the package's backend."""
    if manifest.backend == "onnxruntime":
        from .onnx_backend import open_session

        signature = manifest.signature
        return open_session(path, len(signature.outputs) + len(signature.state), threads)
    device_index = 0 if manifest.device.type == "cuda" else -1
    single_threaded = manifest.runtime.cuda_graphs
    try:
        with private_extraction():
            return torch._C._aoti.AOTIModelPackageLoader(
                # A CUDA-graph package serializes its calls (static buffers) and AOTInductor's
                # single-threaded runner takes one model instance.
                str(path / MODEL_FILE),
                "model",
                single_threaded,
                1 if single_threaded else threads,
                device_index,
            )
    except Exception as exc:  # the C++ loader raises RuntimeError with its own text
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PackageError(
            f"package {path} could not be loaded: {first_line}; rebuild it with `aotc build --force`"
        ) from exc


def _read_state(path: Path, manifest: Manifest) -> list:
    """Initial values of the state a package carries between calls (tensors only: nothing executes)."""
    specs = manifest.signature.state
    if not specs:
        return []
    try:
        state = torch.load(path / STATE_FILE, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise PackageError(
            f"package {path}: its {STATE_FILE} could not be read ({type(exc).__name__}); rebuild it "
            "with `aotc build --force`"
        ) from None
    if (
        not isinstance(state, list)
        or len(state) != len(specs)
        or not all(isinstance(t, torch.Tensor) for t in state)
    ):
        raise PackageError(
            f"package {path}: its {STATE_FILE} does not hold the {len(specs)} tensor(s) the manifest lists; rebuild it"
        )
    # before anything is cloned: a tensor saved as one value expanded (an empty KV cache) is one
    # element on disk whatever shape it claims, so the shape must be the manifest's
    for spec, tensor in zip(specs, state):
        if list(tensor.shape) != list(spec.shape) or str(tensor.dtype) != f"torch.{spec.dtype}":
            raise PackageError(
                f"package {path}: its {STATE_FILE} holds {spec.name} as "
                f"{str(tensor.dtype).split('.')[-1]}{list(tensor.shape)}, but the manifest says "
                f"{spec.dtype}{list(spec.shape)}; rebuild it with `aotc build --force`"
            )
        if not _plain_layout(tensor):
            # the compiled model reads and writes its state in place at contiguous strides: any
            # other layout of the right values computes something else
            raise PackageError(
                f"package {path}: its {STATE_FILE} holds {spec.name} in a layout the model does not "
                "read (not a dense contiguous tensor); rebuild it with `aotc build --force`"
            )
        if tensor.is_floating_point() and bool(torch.isnan(_stored_values(tensor)).any()):
            # the first step would carry it into every token after it (an inf may be a state's
            # start: a running maximum's -inf)
            raise PackageError(
                f"package {path}: its {STATE_FILE} holds {spec.name} with NaN values; rebuild it "
                "with `aotc build --force`"
            )
    return state


def _stored_values(tensor: torch.Tensor) -> torch.Tensor:
    """The values on disk: one for a tensor of one value expanded, else the whole tensor."""
    if tensor.numel() and all(stride == 0 for stride in tensor.stride()):
        return tensor.as_strided((1,), (1,))
    return tensor


def _plain_layout(tensor: torch.Tensor) -> bool:
    """Dense and contiguous, or one value expanded to its shape (aotc build saves a state of one
    value throughout that way; the first clone makes it whole)."""
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_conj() or tensor.is_neg():
        return False
    return tensor.is_contiguous() or all(stride == 0 for stride in tensor.stride())
