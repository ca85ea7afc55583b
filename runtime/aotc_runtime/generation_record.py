"""A text-generation package's record (manifest `generation`): what it holds, and how it is held
against its compiled model.

The record is what the decode loop trusts: the batch it fills, the cache length it counts to, the
vocabulary it checks prompts against, the pad and end-of-sequence ids it feeds back. Nothing in
the compiled model bounds-checks an index without killing the process (the embedding's check is
an abort on the CPU and a device-side assert on CUDA), so a record that disagrees with the model is
refused when the manifest is read, before anything is allocated from its numbers.

The model's side is the signature, which load() compares with the description the compiled model
carries (manifest.check_contract):

    input_ids [T] (value_range [0, vocab - 1])   rows [T]   positions [T]   picks [R]
    logits [R, vocab]   state: per layer, keys and values [B, max_len + 1, kv heads, head dim]

`step_format` names that contract (decode_step.py and aotc/export/row_cache.py say what the inputs
mean). Format 4: a step's tokens are packed, T a dim, and R is the batch B or a dim from 1 to B.
Packages from before (format 3 fed every row a left-padded window, formats before it fed the
whole batch) are refused in one line that says to export and build again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import PackageError
from .fields import Fields, inside_package
from .sampling_settings import InvalidSampling, Sampling
from .signature import Signature

STEP_INPUTS = ("input_ids", "rows", "positions", "picks")
STEP_FORMAT = 4  # the step contract above, as aotc exports it now
STEP_FORMATS = (STEP_FORMAT,)  # the contracts this runtime runs


@dataclass(frozen=True)
class Generation:
    """A text-generation package (`aotc export --task text-generation`): its program is one step
    of generation over a static KV cache, the package's state, of batch_size x max_seq_len."""

    batch_size: int
    max_seq_len: int
    vocab_size: int
    eos_token_ids: tuple = ()  # generation stops at any of them
    pad_token_id: int | None = None
    tokenizer: str | None = None  # the package's tokenizers JSON file, when it carries one
    # the fewest positions a layer's attention looks back over, 0 for none limited; None in
    # packages from before it was recorded (aotc_runtime/decode_engine.py reads it)
    sliding_window: int | None = None
    step_format: int | None = None  # the step's contract; this runtime runs STEP_FORMAT
    # the package's chat template (a Jinja file, hashed; chat_template.py renders it) and the
    # special tokens it is rendered with (bos_token, eos_token, ...), when the model has them
    chat_template: str | None = None
    special_tokens: dict = field(default_factory=dict, hash=False)
    # how the model samples when a request names nothing (its generation_config, as transformers'
    # `generate` reads it: "temperature" 0 when it does not sample): SAMPLING_DEFAULTS' keys; {}
    # in packages from before it was recorded
    sampling_defaults: dict = field(default_factory=dict, hash=False)

    def default_sampling(self) -> Sampling:
        """The Sampling of a request that names no setting (`aotc serve`, `aotc chat`): the
        recorded defaults, greedy where none are recorded (transformers' default)."""
        return Sampling(**{"temperature": 0.0, **self.sampling_defaults})

    @classmethod
    def read(cls, fields: Fields) -> Generation:
        eos = fields.value("eos_token_ids", [])
        if not isinstance(eos, list) or not all(
            isinstance(e, int) and not isinstance(e, bool) for e in eos
        ):
            fields.fail("eos_token_ids", "is not a list of integers")
        generation = cls(
            fields.integer("batch_size"),
            fields.integer("max_seq_len"),
            fields.integer("vocab_size"),
            tuple(eos),
            fields.integer("pad_token_id", None),
            fields.optional_text("tokenizer"),
            fields.integer("sliding_window", None),
            fields.integer("step_format", None),
            fields.optional_text("chat_template"),
            _special_tokens(fields),
            _sampling_defaults(fields),
        )
        if generation.chat_template is not None and not inside_package(generation.chat_template):
            fields.fail("chat_template", "is not a plain path inside the package")
        if generation.tokenizer is not None and not inside_package(generation.tokenizer):
            fields.fail("tokenizer", "is not a plain path inside the package")
        for key in ("batch_size", "max_seq_len", "vocab_size"):
            if getattr(generation, key) < 1:
                fields.fail(key, "is not a positive integer")
        return generation

    def to_json(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "max_seq_len": self.max_seq_len,
            "vocab_size": self.vocab_size,
            "eos_token_ids": list(self.eos_token_ids),
            "pad_token_id": self.pad_token_id,
            "tokenizer": self.tokenizer,
            **({} if self.sliding_window is None else {"sliding_window": self.sliding_window}),
            **({} if self.step_format is None else {"step_format": self.step_format}),
            **({} if self.chat_template is None else {"chat_template": self.chat_template}),
            **({"special_tokens": dict(self.special_tokens)} if self.special_tokens else {}),
            **(
                {"sampling_defaults": dict(self.sampling_defaults)}
                if self.sampling_defaults
                else {}
            ),
        }


MAX_SPECIAL_TOKENS = 64  # a tokenizer's named special tokens are a handful


def _special_tokens(fields: Fields) -> dict:
    tokens = fields.value("special_tokens", {})
    if (
        not isinstance(tokens, dict)
        or len(tokens) > MAX_SPECIAL_TOKENS
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) <= 256 for k, v in tokens.items()
        )
    ):
        fields.fail(
            "special_tokens",
            f"is not an object of at most {MAX_SPECIAL_TOKENS} names to short strings",
        )
    return dict(tokens)


SAMPLING_DEFAULTS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def _sampling_defaults(fields: Fields) -> dict:
    defaults = fields.value("sampling_defaults", {})
    if not isinstance(defaults, dict) or not set(defaults) <= set(SAMPLING_DEFAULTS):
        fields.fail("sampling_defaults", f"is not an object of {', '.join(SAMPLING_DEFAULTS)}")
    try:
        Sampling(**defaults)
    except InvalidSampling as exc:
        fields.fail("sampling_defaults", f"holds a value out of range: {exc}")
    return dict(defaults)


def check_generation_record(
    folder: Path, generation: Generation | None, signature: Signature, files: dict
) -> None:
    """Refuse (PackageError, exit 7) a package whose generation record disagrees with its model."""
    if generation is None:
        return
    check_step_format(folder, generation)
    problem = _disagreement(generation, signature) or _tokenizer_problem(generation, files)
    if problem:
        raise PackageError(
            f"package {folder}: its generation record does not match its compiled model: "
            f"{problem}; rebuild it with `aotc build --force`"
        )


def check_step_format(folder: Path, generation: Generation | None) -> None:
    """Refuse (PackageError) a generation package whose step this runtime does not know how to run."""
    if generation is None or generation.step_format in STEP_FORMATS:
        return
    if generation.step_format is None:
        made = "an aotc from before the generation step had its own KV cache"
    elif generation.step_format < STEP_FORMAT:
        made = (
            f"generation step format {generation.step_format}, from an aotc before the step "
            f"packed its tokens (this runtime runs format {STEP_FORMAT})"
        )
    else:
        made = (
            f"generation step format {generation.step_format}, which this runtime does not know "
            f"(it runs format {STEP_FORMAT})"
        )
    raise PackageError(
        f"package {folder} was built with {made}; export and build it again with this aotc"
    )


def _disagreement(generation: Generation, signature: Signature) -> str | None:
    inputs = {spec.name: spec for spec in signature.inputs}
    missing = [name for name in STEP_INPUTS if name not in inputs]
    if missing or len(signature.outputs) != 1:
        return (
            f"the model is not one generation step (it lacks {', '.join(missing)})"
            if missing
            else f"the model has {len(signature.outputs)} outputs, a generation step has 1 (logits)"
        )
    ids, logits = inputs["input_ids"], signature.outputs[0]
    rows, positions, picks = inputs["rows"], inputs["positions"], inputs["picks"]
    if any(len(t.shape) != 1 for t in (ids, rows, positions, picks)) or len(logits.shape) != 2:
        return "input_ids, rows, positions and picks are not 1-D, or the logits not 2-D"
    if not (ids.shape[0] == rows.shape[0] == positions.shape[0]):
        return "input_ids, rows and positions do not share one length (the step's tokens)"
    if not signature.state or any(len(s.shape) != 4 for s in signature.state):
        return "its state is not a KV cache of [batch, positions, heads, head dim] per layer"
    # the logits of the whole batch's picks, or of R picks: a dim from 1 to the batch
    chosen = picks.shape[0]
    if isinstance(chosen, str):
        span = signature.dims.get(chosen, {})
        if (span.get("min"), span.get("max")) != (1, generation.batch_size):
            return (
                f"the step's picks {chosen} run {span.get('min')}..{span.get('max')}, not 1.."
                f"{generation.batch_size} (its batch_size)"
            )
    else:
        chosen = generation.batch_size
    checks = [
        ("batch_size", picks.shape[0], chosen),
        ("batch_size", logits.shape[0], chosen),
        ("vocab_size", logits.shape[1], generation.vocab_size),
    ]
    for cache in signature.state:
        checks.append(("batch_size", cache.shape[0], generation.batch_size))
        # a string is a symbol: a cache whose length is not fixed is not this contract's
        positions = cache.shape[1] - 1 if isinstance(cache.shape[1], int) else cache.shape[1]
        checks.append(("max_seq_len", positions, generation.max_seq_len))
    for what, size, expected in checks:
        if size != expected:
            return f"{what} is {expected} but the model's is {size}"
    if ids.value_range is not None and ids.value_range[1] != generation.vocab_size - 1:
        return (
            f"vocab_size is {generation.vocab_size} but the model's token ids go up to "
            f"{ids.value_range[1]}"
        )
    named = [("pad_token_id", generation.pad_token_id)] + [
        ("eos_token_ids", eos) for eos in generation.eos_token_ids
    ]
    for what, token in named:
        if token is not None and not 0 <= token < generation.vocab_size:
            return f"{what} holds {token}, outside the vocabulary (0..{generation.vocab_size - 1})"
    if generation.sliding_window is not None and generation.sliding_window < 0:
        return f"sliding_window is {generation.sliding_window}, below 0"
    return None


def _tokenizer_problem(generation: Generation, files: dict) -> str | None:
    # a tokenizer the hashes do not cover could be anything the folder happens to hold
    if generation.tokenizer is not None and generation.tokenizer not in files:
        return f"its tokenizer {generation.tokenizer} is not one of the package's hashed files"
    if generation.chat_template is not None and generation.chat_template not in files:
        return (
            f"its chat template {generation.chat_template} is not one of the package's hashed files"
        )
    return None
