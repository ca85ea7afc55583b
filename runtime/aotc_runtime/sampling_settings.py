"""A sequence's sampling settings (`Sampling`), their accepted ranges and their check, without
torch: the runtime's sampler (sampling.py) and requests (generation_request.py), `aotc serve`'s
request fields and the CLI's options (imported for `--help` without torch) all read these, so each
range has one owner.

A `Sampling` is checked when it is made: one outside the ranges cannot exist (InvalidSampling,
naming the field). Its field names are the HTTP fields' names (`SAMPLING_FIELDS`), so a front end
builds one straight from what a client sent and names the field a refusal is about."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .errors import GenerationInputError

# The accepted ranges, the same in the Python API, `aotc generate`, the C++ runner and HTTP
# (docs/reliability.md). Below MIN_TEMPERATURE, logits / temperature overflows float32 for large
# logits and softmax gives NaN (vLLM raises such temperatures to 0.01 for the same reason); below
# MIN_TOP_P the nucleus is one token anyway, and float32 cannot tell the bound from 0.
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0
MIN_TOP_P = 1e-6
MAX_TOP_K = 2**31 - 1
MAX_SEED = 2**64 - 1  # a generator's seed is 64 bits
MAX_PENALTY = 2.0  # presence and frequency penalties: OpenAI's range, -2 to 2
# The repetition penalty divides logits, as temperature does: the same float32 bounds keep a
# penalized logit finite (transformers and vLLM only ask for a value above 0)
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0
MAX_LOGPROBS = 20  # the most likely tokens a step reports at most (OpenAI's top_logprobs cap)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_whole_number(value: object) -> bool:
    """An int that is not a bool (JSON and Python both let True pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


class InvalidSampling(GenerationInputError):
    """A sampling setting outside its accepted range: one line naming the value and the range;
    `field` is the Sampling field (and HTTP field) at fault."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


# the float settings: a whole number given for one (JSON's 1 for 1.0) is kept as that float, so
# every Sampling holds the types the sampler's buffers take
_FLOATS = (
    "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
)  # fmt: skip


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy (argmax)
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    min_p: float | None = None  # None or 0: none
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: none

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether a penalty changes this row's logits (greedy rows too, as in `generate`)."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    def filtered(self, vocab: int) -> bool:
        """Whether top-k, top-p or min-p drops tokens from this sampled row's choice."""
        return not self.greedy and (
            (self.top_k is not None and self.top_k < vocab)
            or (self.top_p is not None and self.top_p < 1)
            or bool(self.min_p)
        )

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem is not None:
            raise InvalidSampling(*problem)
        for name in _FLOATS:
            value = getattr(self, name)
            if isinstance(value, int):
                object.__setattr__(self, name, float(value))

    def _problem(self) -> tuple[str, str] | None:
        """(why these settings are not valid, the field at fault), or None."""
        t = self.temperature
        if not _is_number(t) or not (t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            return (
                f"temperature {t!r} is outside the accepted values: 0 for greedy, or "
                f"{MIN_TEMPERATURE} to {MAX_TEMPERATURE:g} to sample",
                "temperature",
            )
        if self.top_k is not None and not (
            is_whole_number(self.top_k) and 1 <= self.top_k <= MAX_TOP_K
        ):
            return f"top-k {self.top_k!r} is not a whole number from 1 to {MAX_TOP_K}", "top_k"
        p = self.top_p
        if p is not None and not (_is_number(p) and MIN_TOP_P <= p <= 1.0):
            return f"top-p {p!r} is outside [{MIN_TOP_P:g}, 1]", "top_p"
        if self.seed is not None and not (
            is_whole_number(self.seed) and 0 <= self.seed <= MAX_SEED
        ):
            return f"seed {self.seed!r} is not a whole number from 0 to 2**64-1", "seed"
        if self.min_p is not None and not (_is_number(self.min_p) and 0 <= self.min_p <= 1):
            return f"min-p {self.min_p!r} is outside [0, 1] (0: none)", "min_p"
        for name, value in (
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ):
            if not (_is_number(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
                words = name.replace("_", " ")
                return (
                    f"{words} {value!r} is outside [-{MAX_PENALTY:g}, {MAX_PENALTY:g}] (0: none)",
                    name,
                )
        r = self.repetition_penalty
        if not (_is_number(r) and MIN_REPETITION_PENALTY <= r <= MAX_REPETITION_PENALTY):
            return (
                f"repetition penalty {r!r} is outside [{MIN_REPETITION_PENALTY:g}, "
                f"{MAX_REPETITION_PENALTY:g}] (1: none; above 1 discourages repeats)",
                "repetition_penalty",
            )
        return None


GREEDY = Sampling()
SAMPLING_FIELDS = tuple(f.name for f in fields(Sampling))  # the HTTP fields of the same names
