"""Typed configuration for each stage. Flags and YAML files fill the same frozen dataclasses.

Precedence: defaults < mode preset (configs/modes/<mode>.yaml) < --config FILE.yaml < flags.
Rules about meaning live in `validate()`, which gathers every problem before failing once.
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass, field, replace
from pathlib import Path

from aotc.errors import UserInputError


def _configs_dir() -> Path:
    """The mode presets: aotc/configs inside an installed wheel (pyproject.toml maps the top-level
    configs/ there), else the checkout's configs/ (an editable install, or running from the tree)."""
    here = Path(__file__).resolve().parent
    packaged = here / "configs"
    return packaged if packaged.is_dir() else here.parent / "configs"


CONFIGS_DIR = _configs_dir()
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
INPUT_DTYPES = FLOAT_DTYPES + ("int64", "int32", "int16", "int8", "uint8", "bool")


class Mode(str, enum.Enum):
    DEFAULT = "default"
    REDUCE_OVERHEAD = "reduce-overhead"
    MAX_AUTOTUNE = "max-autotune"


class Precision(str, enum.Enum):
    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"


@dataclass(frozen=True)
class ExportConfig:
    model: str
    output: Path
    input_shapes: tuple = ()
    dims: tuple = ()
    dtypes: tuple = ()
    entry: str | None = None
    weights: Path | None = None
    strict: bool = False
    force: bool = False
    format: str = "pt2"  # pt2 (the artifact aotc build takes) or onnx (aotc/export/onnx.py)
    # text-generation: the model is a decoder LM exported as one step of generation over a static
    # KV cache of batch_size x max_seq_len (aotc/export/text_generation.py)
    task: str | None = None
    max_seq_len: int | None = None
    # rows of the KV cache: sequences generated at once; None: text_generation.default_batch_size
    batch_size: int | None = None
    tokenizer: Path | None = None  # a folder with tokenizer.json, carried into the package

    def _task_problems(self) -> list:
        if self.task is None:
            return (
                ["--max-seq-len, --batch-size and --tokenizer go with --task text-generation"]
                if self.max_seq_len is not None or self.batch_size is not None or self.tokenizer
                else []
            )
        problems = []
        if self.task != "text-generation":
            problems.append(f"--task {self.task} is not one of: text-generation")
        # the task makes the inputs, so --dtype is the model's (a folder's default: its config's)
        if len(self.dtypes) > 1 or any(
            d not in ("float32", "bfloat16", "float16") for d in self.dtypes
        ):
            problems.append(
                f"--dtype {' '.join(self.dtypes)}: with --task text-generation --dtype is the "
                "model's dtype (the task makes the inputs); give one of float32, bfloat16, float16"
            )
        if self.max_seq_len is None or self.max_seq_len < 2:
            problems.append(
                "--task text-generation needs --max-seq-len N (at least 2): the KV cache's length, "
                "prompt and new tokens together"
            )
        if self.batch_size is not None and self.batch_size < 1:
            problems.append("--batch-size must be at least 1")
        if self.input_shapes or self.dims:
            problems.append(
                "--task text-generation makes the inputs itself; leave out --input-shape and --dim"
            )
        if self.format != "pt2":
            problems.append("--task text-generation exports a .pt2 artifact, not --format onnx")
        if self.tokenizer is not None and not (Path(self.tokenizer) / "tokenizer.json").is_file():
            problems.append(
                f"--tokenizer {self.tokenizer} has no tokenizer.json; give a transformers tokenizer "
                "folder with a fast tokenizer (tokenizer.save_pretrained writes one)"
            )
        return problems

    def dtype_for(self, index: int) -> str:
        if not self.dtypes:
            return "float32"
        return self.dtypes[0] if len(self.dtypes) == 1 else self.dtypes[index]

    def validate(self) -> None:
        problems = []
        if (
            self.dtypes
            and len(self.dtypes) not in (1, len(self.input_shapes))
            and self.input_shapes
        ):
            problems.append(
                f"{len(self.dtypes)} --dtype for {len(self.input_shapes)} --input-shape; give one for "
                "all or one per input"
            )
        for dtype in self.dtypes:
            if dtype not in INPUT_DTYPES:
                problems.append(f"--dtype {dtype} is not one of {', '.join(INPUT_DTYPES)}")
        if self.output.exists() and not self.force:
            problems.append(
                f"output {self.output} exists; pass --force to overwrite it or choose another -o"
            )
        if self.weights is not None and not self.weights.is_file():
            problems.append(f"--weights {self.weights} does not exist")
        problems += self._task_problems()
        if problems:
            raise UserInputError("; ".join(problems))


DEVICES = ("auto", "cpu", "cuda")
# --cpu-isa: name -> (cpp.march, cpp.simdlen); native leaves Inductor's defaults (-march=native,
# best vector ISA). aotc/compiler/cpu_isa.py applies them and records what the compiler was allowed.
ISAS = {"native": (None, None), "avx2": ("x86-64-v3", 256), "avx512": ("x86-64-v4", 512)}


@dataclass(frozen=True)
class BuildConfig:
    artifact: Path
    output: Path  # the CLI's default: default_package_folder(artifact)
    mode: Mode = Mode.DEFAULT
    device: str = "auto"  # auto, cpu or cuda; resolve_device() turns auto into cpu or cuda
    # what was asked (auto/cpu/cuda), set by resolve_device(); in the manifest
    requested_device: str | None = None
    precision: Precision = Precision.FP32
    options: dict = field(default_factory=dict)  # Inductor options layered over the mode preset
    atol: float | None = None
    rtol: float | None = None
    allow_mismatch: bool = False
    force: bool = False
    # Link the model .so with -Wl,-Bsymbolic (see aotc/compiler/toolchain.py); on by default, harmless where not needed.
    bsymbolic: bool = True
    # The CPU instruction set the C++ code is compiled for (aotc/compiler/cpu_isa.py): native is the
    # build machine's; avx2 and avx512 are portable x86-64 levels.
    cpu_isa: str = "native"
    # aotinductor, or onnxruntime (aotc/compiler/backends/onnxruntime.py): what compiles and runs the model
    backend: str = "aotinductor"
    # --tune: build the candidates of configs/tune/<device>.yaml, keep the fastest that passes
    tune: bool = False
    tune_budget_s: float | None = None  # None: no limit
    tune_jobs: int = 1  # candidate builds run at once
    tune_candidates: tuple = ()  # names from configs/tune/<device>.yaml; () for all
    # the runtime turns torch.backends.cudnn.benchmark on around calls (CUDA)
    cudnn_benchmark: bool = False
    # --specialize B=1,8: (dim name, sizes) of the static-shape members, () for none
    specialize: tuple = ()
    # --quantize: the linear layers' weights stored quantized (aotc/export/quantization.py)
    quantize: str | None = None
    group_size: int | None = None  # int4-weight-only's input features per scale
    quantize_skip: tuple = ()  # layers whose names contain one of these stay unquantized
    # how int4's levels are chosen: None or "rtn" rounds each weight, "gptq" calibrates
    # (aotc/export/gptq.py)
    quantize_method: str | None = None
    # CUDA text generation: each product with its norm, activation and residual add in one of
    # aotc's kernels at decode's row counts (aotc/export/fused_products.py). Off by default until
    # measured beyond SmolLM2's shape (docs/benchmarks.md)
    fused_products: bool = False
    # CUDA, compute capability 9.0+: aotc's kernels launched with programmatic dependent launch
    # (aotc/compiler/programmatic_launch.py)
    pdl: bool = False

    def validate(self) -> None:
        problems = []
        if self.tune_budget_s is not None and self.tune_budget_s <= 0:
            problems.append(f"--tune-budget must be positive, got {self.tune_budget_s:g}s")
        if self.tune_jobs < 1:
            problems.append(f"--tune-jobs must be >= 1, got {self.tune_jobs}")
        if (
            self.tune_budget_s is not None or self.tune_jobs != 1 or self.tune_candidates
        ) and not self.tune:
            problems.append(
                "--tune-budget, --tune-jobs and --tune-candidates go with --tune; add --tune"
            )
        if self.cudnn_benchmark and self.device != "cuda":
            problems.append(
                "--cudnn-benchmark is a CUDA setting; build with --device cuda or leave it out"
            )
        if self.pdl and self.device != "cuda":
            problems.append(
                "--pdl is a CUDA setting (compute capability 9.0 or later); build with "
                "--device cuda or leave it out"
            )
        if self.fused_products and self.device != "cuda":
            problems.append(
                "--fused-products is a CUDA text-generation setting; build with --device cuda "
                "or leave it out"
            )
        if not self.artifact.is_file():
            problems.append(
                f"artifact {self.artifact} does not exist; create one with `aotc export MODEL -o {self.artifact}`"
            )
        if self.output.exists() and not self.force:
            problems.append(
                f"output {self.output} exists; pass --force to replace it or choose another -o"
            )
        if self.device not in DEVICES:
            problems.append(f"--device {self.device} is not one of {', '.join(DEVICES)}")
        if self.precision == Precision.TF32 and self.device == "cpu":
            why = (
                "; --device auto chose cpu: this machine has no CUDA GPU"
                if self.requested_device == "auto"
                else ""
            )
            problems.append(
                f"--precision tf32 needs --device cuda (TF32 is a GPU tensor-core format){why}"
            )
        for name, value in (("--atol", self.atol), ("--rtol", self.rtol)):
            if value is not None and value < 0:
                problems.append(f"{name} must be >= 0, got {value}")
        if self.cpu_isa not in ISAS:
            problems.append(f"--cpu-isa {self.cpu_isa} is not one of {', '.join(ISAS)}")
        problems += self._quantize_problems()
        if problems:
            raise UserInputError("; ".join(problems))

    def _quantize_problems(self) -> list:
        if self.quantize is None:
            given = self.group_size is not None or self.quantize_skip or self.quantize_method
            return (
                ["--group-size, --quantize-skip and --quantize-method go with --quantize; add it"]
                if given
                else []
            )
        from aotc.quantize_schemes import METHODS, problems

        found = problems(self.quantize, self.group_size, self.device)
        method = self.quantize_method or "rtn"
        if method not in METHODS:
            found.append(f"--quantize-method {method} is not one of {', '.join(METHODS)}")
        elif method == "gptq" and self.quantize != "int4-weight-only":
            found.append(
                "--quantize-method gptq goes with --quantize int4-weight-only "
                "(the other schemes round to nearest); leave it out"
            )
        if self.backend != "aotinductor":
            found.append(f"--quantize builds with AOTInductor, not --backend {self.backend}")
        if self.specialize:
            found.append("--quantize and --specialize do not go together yet; choose one")
        return found

    def quantization(self):
        """The --quantize request as the build's pass takes it (None without --quantize)."""
        if self.quantize is None:
            return None
        from aotc.quantize_schemes import Quantization

        return Quantization(
            self.quantize, self.group_size, self.quantize_skip, self.quantize_method or "rtn"
        )


def default_package_folder(artifact: Path) -> Path:
    """Where `aotc build` writes without -o: beside the artifact, named after it (demo_out/mlp.pt2
    -> demo_out/mlp_pkg)."""
    artifact = Path(artifact)
    return artifact.parent / f"{artifact.stem}_pkg"


def resolve_device(config: BuildConfig) -> tuple[BuildConfig, str]:
    """Turn --device auto into cuda (torch sees a GPU) or cpu; return the config and a line saying which and why.

    Done once, before validate(), so every rule and stage after it sees the real target (tf32 with
    auto on a CPU-only machine is refused as tf32 on the CPU) and cfg.device is only ever cpu or
    cuda from then on; requested_device keeps what was asked, for the manifest. The line is "" when
    nothing was resolved.
    """
    if config.device != "auto":
        return replace(config, requested_device=config.requested_device or config.device), ""
    import torch

    if torch.cuda.is_available():
        device, why = "cuda", torch.cuda.get_device_name(0)
    else:
        device, why = "cpu", "no CUDA GPU"
    return replace(
        config, device=device, requested_device="auto"
    ), f"device auto -> {device} ({why})"


BUILD_FILE_KEYS = {
    "mode",
    "device",
    "precision",
    "options",
    "atol",
    "rtol",
    "allow_mismatch",
    "bsymbolic",
    "cpu_isa",
    "backend",
    "quantize",
    "group_size",
    "quantize_method",
}


def load_yaml(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise UserInputError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserInputError(
            f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(data, dict):
        raise UserInputError(f"config file {path} must hold a mapping of keys to values")
    return data


def reject_unknown(keys, allowed, where: str) -> None:
    for key in keys:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = (
                f" (did you mean '{close[0]}'?)"
                if close
                else f"; known keys: {', '.join(sorted(allowed))}"
            )
            raise UserInputError(f"{where}: unknown key '{key}'{hint}")


def apply_config_file(config: BuildConfig, path: Path, flags_given: set) -> BuildConfig:
    """Layer a --config YAML under the flags the user typed (flags win)."""
    data = load_yaml(path)
    reject_unknown(data, BUILD_FILE_KEYS, f"config file {path}")
    changes = {}
    for key, value in data.items():
        if key in flags_given:
            continue
        if key == "mode":
            value = _enum(Mode, value, path)
        elif key == "precision":
            value = _enum(Precision, value, path)
        elif key == "options":
            if not isinstance(value, dict):
                raise UserInputError(
                    f"config file {path}: 'options' must be a mapping of Inductor options"
                )
            value = {**value, **config.options}
        changes[key] = value
    return replace(config, **changes)


def _enum(kind, value, path):
    try:
        return kind(value)
    except ValueError:
        raise UserInputError(
            f"config file {path}: '{value}' is not one of {', '.join(m.value for m in kind)}"
        ) from None


def mode_preset(mode: Mode) -> dict:
    """The YAML preset of a mode: {'inductor': {common + per-device options}, 'runtime': {...}}."""
    path = CONFIGS_DIR / "modes" / f"{mode.value}.yaml"
    if not path.is_file():
        from aotc.errors import InternalError

        raise InternalError(
            f"mode preset {path} is missing from the aotc installation; reinstall aotc from its checkout"
        )
    data = load_yaml(path)
    reject_unknown(data, {"description", "inductor", "runtime"}, f"preset {path}")
    return data


def preset_inductor_options(mode: Mode, device: str) -> dict:
    inductor = mode_preset(mode).get("inductor") or {}
    return {**(inductor.get("common") or {}), **(inductor.get(device) or {})}


def preset_runtime(mode: Mode) -> dict:
    return dict(mode_preset(mode).get("runtime") or {})
