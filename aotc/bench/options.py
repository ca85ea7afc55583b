"""What `aotc bench` is asked: BenchConfig, filled by the CLI's flags or by Python callers, and
the parsers of --against and --batch-sizes that the CLI checks syntax with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aotc.bench.generation import BASELINES as GENERATION_BASELINES
from aotc.config import Mode
from aotc.errors import UserInputError

COMPILE_MODES = tuple(mode.value for mode in Mode)
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
ONE_CALL_BASELINES = ("eager", "cpp", "onnxruntime") + tuple(f"compile:{m}" for m in COMPILE_MODES)


def parse_against(text: str) -> tuple:
    """'eager,compile:max-autotune' -> ('eager', 'compile:max-autotune'); 'none' -> (); ValueError if unknown.

    Names of either kind of package; which kind takes which is checked once the package is read."""
    names = []
    for raw in text.split(","):
        item = raw.strip()
        if item in ("", "none"):
            continue
        if item == "compile":
            item = "compile:default"
        if item not in ONE_CALL_BASELINES + GENERATION_BASELINES:
            known = ", ".join(ONE_CALL_BASELINES + ("none",))
            raise ValueError(
                f"'{item}' is not a contender; use a comma-separated list of {known} (text-generation "
                f"packages: {', '.join(GENERATION_BASELINES)})"
            )
        if item not in names:
            names.append(item)
    return tuple(names)


def parse_batch_sizes(text: str) -> tuple:
    """'1,8,16' -> (1, 8, 16); ValueError on anything but positive integers."""
    sizes = []
    for raw in text.split(","):
        item = raw.strip()
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"'{item}' is not a positive integer; give batch sizes like 1,8,16")
        if int(item) not in sizes:
            sizes.append(int(item))
    return tuple(sizes)


@dataclass(frozen=True)
class CallCounts:
    """A one-call package's counts, defaults filled in (BenchConfig.for_one_call)."""

    iters: int
    warmup: int
    cold_start: bool
    cold_runs: int


@dataclass(frozen=True)
class BenchConfig:
    """What `aotc bench` measures. None: the default for the package's kind (a one-call package's
    below; a text-generation package's in aotc/bench/generation_bench.py, which refuses the
    one-call options given to it and takes prompt_tokens and new_tokens, which a one-call package
    refuses)."""

    package: Path
    # None: eager, compile:default and compile at the package's mode (text generation: eager and
    # static-compile)
    against: tuple | str | None = None
    artifact: Path | None = None  # None: the artifact the manifest names
    iters: int | None = None  # timed calls per contender and batch size [100]
    warmup: int | None = None  # untimed calls per contender and batch size, after the first [10]
    rounds: int = 10  # interleaved rounds the timed calls are split into
    batch_sizes: tuple = ()  # () -> the exported example size
    cold_start: bool | None = None  # [True]
    cold_runs: int | None = None  # [3]
    json_path: Path | None = None
    plot_path: Path | None = None
    seed: int = 0
    prompt_tokens: int | None = None  # text generation: the prompt's length
    new_tokens: int | None = None  # text generation: the tokens each run generates
    # CPU threads of every contender's calls, cold starts and the C++ runner included; None: one
    # per physical core the process may use (aotc_runtime.threads), or OMP_NUM_THREADS when set
    threads: int | None = None

    def for_one_call(self) -> CallCounts:
        """A one-call package's counts, its defaults where this config says None; a
        UserInputError if it sets what only a text-generation package takes."""
        given = [
            flag
            for flag, value in (
                ("--prompt-tokens", self.prompt_tokens),
                ("--new-tokens", self.new_tokens),
            )
            if value is not None
        ]
        given += [
            f"--against {n}"
            for n in parse_against(self.against_text())
            if n not in ONE_CALL_BASELINES
        ]
        if given:
            raise UserInputError(
                f"{' and '.join(given)}: for text-generation packages (aotc export --task "
                f"text-generation); {self.package} is a one-call package: leave "
                f"{'it' if len(given) == 1 else 'them'} out"
            )
        return CallCounts(
            iters=100 if self.iters is None else self.iters,
            warmup=10 if self.warmup is None else self.warmup,
            cold_start=True if self.cold_start is None else self.cold_start,
            cold_runs=3 if self.cold_runs is None else self.cold_runs,
        )

    def against_text(self) -> str:
        """--against as text; Python callers may give a tuple of names or one comma-separated string."""
        return self.against if isinstance(self.against, str) else ",".join(self.against or ())

    def validate(self) -> None:
        problems = []
        for flag, value, least in (
            ("--iters", self.iters, 1),
            ("--warmup", self.warmup, 0),
            ("--rounds", self.rounds, 1),
            ("--cold-runs", self.cold_runs, 1),
            ("--prompt-tokens", self.prompt_tokens, 1),
            ("--new-tokens", self.new_tokens, 2),  # the decode rate is over tokens 2..new
        ):
            if value is not None and value < least:
                problems.append(f"{flag} must be >= {least}, got {value}")
        try:
            parse_against(self.against_text())
        except ValueError as exc:
            problems.append(f"--against: {exc}")
        if any(not isinstance(b, int) or b < 1 for b in self.batch_sizes):
            problems.append(
                f"--batch-sizes must be positive integers, got {list(self.batch_sizes)}"
            )
        if self.artifact is not None and not Path(self.artifact).is_file():
            problems.append(
                f"--artifact {self.artifact} does not exist; pass the .pt2 the package was built from"
            )
        for flag, path in (("--json", self.json_path), ("--plot", self.plot_path)):
            if path is not None and str(path) != "-" and not Path(path).resolve().parent.is_dir():
                problems.append(
                    f"{flag} {path}: folder {Path(path).parent} does not exist; create it or choose another path"
                )
        if self.plot_path is not None and Path(self.plot_path).suffix.lower() not in PLOT_SUFFIXES:
            problems.append(f"--plot {self.plot_path} must end in {', '.join(PLOT_SUFFIXES)}")
        if problems:
            raise UserInputError("; ".join(problems))
