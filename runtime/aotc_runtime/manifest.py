"""The package format: `manifest.json` plus the files it lists with their sha256.

This module is the one contract between aotc (which writes packages) and the runtime (which reads
them). Bump FORMAT_VERSION on any change a reader of the old format would misread.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PackageError
from .fields import FieldError, Fields, inside_package, shown
from .generation_record import Generation, check_generation_record
from .signature import Signature

FORMAT_VERSION = 4
# Format 1 lacked the signature's output_structure, keyword inputs and state; format 2 lacked the
# manifest's own hash, the description of the package embedded in its compiled model, and the CPU
# features a CPU package needs; format 3 returned the state's new values after the outputs, where
# format 4's program updates its state inputs in place (signature.state_in_place). This reader
# fills in what older packages mean, so they keep loading; an older reader refuses a newer format.
READABLE_VERSIONS = (1, 2, 3, 4)


def format_version_for(signature: Signature) -> int:
    """The format a package is written in: 4 only where the program updates its state in place,
    which a format-3 reader would misread (it takes the state from the outputs); a package
    without state is format 3, and format-3 runtimes keep reading it."""
    return 4 if signature.state_in_place else 3


HASH_FIELD = "manifest_sha256"  # sha256 of manifest.json with this field's value set to 64 zeros
CONTRACT_KEY = "aotc.contract"  # AOTInductor package metadata: what the compiled model was built as
MANIFEST_NAME = "manifest.json"
MODEL_FILE = "model.pt2"
SIGNATURE_FILE = "manifest.json.sig"  # `aotc sign`: ed25519 over manifest.json's bytes
STATE_FILE = "state.pt"  # initial values of the state carried between calls (signature["state"])
# The compiled model's file for each backend: AOTInductor's package, or an ONNX graph that ONNX
# Runtime optimized at build (aotc build --backend onnxruntime).
MODEL_FILES = {"aotinductor": MODEL_FILE, "onnxruntime": "model.onnx"}


@dataclass(frozen=True)
class Source:
    artifact: str  # the export artifact's path at build time
    sha256: str

    @classmethod
    def read(cls, fields: Fields) -> Source:
        return cls(fields.text("artifact"), fields.text("sha256"))

    def to_json(self) -> dict:
        return {"artifact": self.artifact, "sha256": self.sha256}


@dataclass(frozen=True)
class Toolchain:
    """What the package needs at run time (torch, platform, cuda) and, in `build_tools`, what built it."""

    torch: str
    python: str = ""
    platform: str = ""  # "linux-x86_64"
    cuda: str | None = None  # null for CPU builds
    # cxx, link_flags, triton, ptxas, ...: informational
    build_tools: dict = field(default_factory=dict)

    @classmethod
    def read(cls, fields: Fields) -> Toolchain:
        known = ("torch", "python", "platform", "cuda")
        return cls(
            fields.text("torch"),
            fields.text("python", ""),
            fields.text("platform", ""),
            fields.optional_text("cuda"),
            {k: v for k, v in fields.data.items() if k not in known},
        )

    def to_json(self) -> dict:
        return {
            "torch": self.torch,
            "python": self.python,
            "platform": self.platform,
            "cuda": self.cuda,
            **self.build_tools,
        }


@dataclass(frozen=True)
class Device:
    type: str  # "cpu" or "cuda"
    requested: str | None = None  # "auto", "cpu" or "cuda" as asked at build
    gpu_name: str | None = None
    compute_capability: str | None = None  # "9.0": CUDA packages run only on this architecture
    # CPU packages: the instruction set asked for (`aotc build --cpu-isa`: native, avx2, avx512) and
    # the extensions the compiled code may use, in /proc/cpuinfo's names (empty: not recorded)
    cpu_isa: str | None = None
    cpu_features: tuple[str, ...] = ()
    # CPU packages with weights in a layout torch's CPU kernels lay out per CPU capability (int4's
    # tiles): the capability they were packed for ("AVX512", "AVX2", "DEFAULT"), which torch must
    # run here too
    aten_cpu_capability: str | None = None

    @classmethod
    def read(cls, fields: Fields) -> Device:
        kind = fields.choice("type", ("cpu", "cuda"))
        device = cls(
            kind,
            fields.optional_text("requested"),
            fields.optional_text("gpu_name"),
            fields.optional_text("compute_capability"),
            fields.optional_text("cpu_isa"),
            fields.strings("cpu_features", []),
            fields.optional_text("aten_cpu_capability"),
        )
        if kind == "cuda" and not device.compute_capability:
            fields.fail("compute_capability", "is missing for a cuda package")
        return device

    def to_json(self) -> dict:
        data: dict = {"type": self.type, "requested": self.requested}
        if self.type == "cuda":
            data.update(gpu_name=self.gpu_name, compute_capability=self.compute_capability)
        if self.cpu_isa is not None:
            data.update(cpu_isa=self.cpu_isa, cpu_features=list(self.cpu_features))
        data.update(aten_cpu_capability=self.aten_cpu_capability)
        return {k: v for k, v in data.items() if v is not None}


@dataclass(frozen=True)
class RuntimeSettings:
    """What a runtime does around calls."""

    cuda_graphs: bool = False  # capture one CUDA graph per input signature and replay it
    tf32: bool = False  # TF32 matmuls/convolutions on around each call (and capture)
    # torch.backends.cudnn.benchmark on around each call: cuDNN times its convolution algorithms
    # at the first call per shape and keeps the fastest (aotc build --cudnn-benchmark)
    cudnn_benchmark: bool = False

    @classmethod
    def read(cls, fields: Fields) -> RuntimeSettings:
        return cls(
            fields.boolean("cuda_graphs"),
            fields.boolean("tf32"),
            fields.boolean("cudnn_benchmark", False),
        )

    def to_json(self) -> dict:
        data = {"cuda_graphs": self.cuda_graphs, "tf32": self.tf32}
        if self.cudnn_benchmark:  # absent when off: older packages' embedded contracts stay equal
            data["cudnn_benchmark"] = True
        return data


@dataclass(frozen=True)
class OutputCheck:
    """The numeric check of one output: the worst difference from eager over all cases."""

    name: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    ok: bool
    worst_case: str

    @classmethod
    def read(cls, fields: Fields) -> OutputCheck:
        return cls(
            fields.text("name"),
            fields.number("max_abs"),
            fields.number("max_rel"),
            fields.number("atol"),
            fields.number("rtol"),
            fields.boolean("ok"),
            fields.text("worst_case"),
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "atol": self.atol,
            "rtol": self.rtol,
            "ok": self.ok,
            "worst_case": self.worst_case,
        }


@dataclass(frozen=True)
class NumericCheck:
    """The build's check of the package against the program run eagerly."""

    reference: str
    cases: tuple[str, ...]
    atol: float
    rtol: float
    outputs: tuple[OutputCheck, ...]
    passed: bool

    PENDING = {"status": "pending"}  # what the manifest holds while the build's check runs

    @classmethod
    def read(cls, fields: Fields) -> NumericCheck | None:
        if fields.data == cls.PENDING:
            return None
        return cls(
            fields.text("reference"),
            fields.strings("cases"),
            fields.number("atol"),
            fields.number("rtol"),
            fields.items("outputs", OutputCheck.read),
            fields.boolean("passed"),
        )

    def to_json(self) -> dict:
        return {
            "reference": self.reference,
            "cases": list(self.cases),
            "atol": self.atol,
            "rtol": self.rtol,
            "outputs": [o.to_json() for o in self.outputs],
            "passed": self.passed,
        }


@dataclass(frozen=True)
class Specialization:
    """A static-shape member of a package (`aotc build --specialize B=1,8`): the model compiled for
    these values of dynamic dims, in its own package folder inside this one. Calls whose inputs
    have exactly these values run it; every other call runs the package's dynamic model."""

    dims: dict  # dim name -> size
    package: str  # relative path of the member's package folder

    @classmethod
    def read(cls, fields: Fields) -> Specialization:
        dims = fields.raw_object("dims")
        if not dims or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 for v in dims.values()
        ):
            fields.fail("dims", "is not a non-empty object of dim name -> size")
        package = fields.text("package")
        if not inside_package(package):
            fields.fail("package", f"is {package!r}, not a plain path inside the package")
        return cls(dict(dims), package)

    @property
    def label(self) -> str:
        return ",".join(f"{name}={size}" for name, size in self.dims.items())

    def to_json(self) -> dict:
        return {"dims": dict(self.dims), "package": self.package}


@dataclass(frozen=True)
class SharedWeights:
    """One copy of the weights for a package and its specialized members (`aotc build
    --specialize`): `file` (torch.save of name -> tensor, read with weights_only) holds the
    constants of every program in `programs` ("." the package's own model, else a member's
    folder), whose model.pt2 then carries none; a program's constant NAME is the entry
    "FOLDER::NAME" where it differs from the others, else "NAME". The runtimes point each program
    at these tensors without copying them (AOTInductor's user-managed constants)."""

    file: str
    programs: tuple

    @classmethod
    def read(cls, fields: Fields) -> SharedWeights:
        file = fields.text("file")
        if not inside_package(file):
            fields.fail("file", f"is {file!r}, not a plain path inside the package")
        programs = fields.value("programs")
        if not isinstance(programs, list) or not all(
            isinstance(p, str) and (p == "." or inside_package(p)) for p in programs
        ):
            fields.fail("programs", "is not a list of '.' and member folders")
        return cls(file, tuple(programs))

    def to_json(self) -> dict:
        return {"file": self.file, "programs": list(self.programs)}


MODES = ("default", "reduce-overhead", "max-autotune")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class Manifest:
    """manifest.json, typed. Field meanings and compatibility rules: docs/package-format.md."""

    aotc_version: str
    created: str
    toolchain: Toolchain
    device: Device
    mode: str
    precision: str
    inductor_options: dict
    runtime: RuntimeSettings
    signature: Signature
    files: dict  # relative path -> sha256 of every file but the manifest
    build_seconds: float
    numeric_check: NumericCheck | None  # None while the build's check runs ("pending")
    model: str | None = None
    source: Source | None = None
    size_bytes: int | None = None
    build_phases: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    backend: str = "aotinductor"
    # What differs between two builds of the same artifact with the same options and toolchain,
    # and why (every other byte of the package is the same): written by the build, never read.
    varies_per_build: dict = field(default_factory=dict)
    # onnxruntime: its version, the optimization level applied at build, whether the optimized
    # graph is tied to the build machine's hardware
    backend_options: dict = field(default_factory=dict)
    # static-shape members dispatched on their dims' values (--specialize)
    specializations: tuple = ()
    # what `aotc build --tune` tried, measured and chose: written by the build, read by people
    tuning: dict = field(default_factory=dict)
    # a text-generation package: what its loop needs (Generation above); None for one-call models
    generation: Generation | None = None
    # one copy of the weights for the package and its members (SharedWeights above)
    shared_weights: SharedWeights | None = None
    # `aotc build --quantize`: the scheme, its group size, the layers quantized (each with its
    # error on the example inputs) and those kept in the base precision, and why; {} for none.
    # Written by the build, read by people and `aotc verify`: the compiled model holds the kernels.
    quantization: dict = field(default_factory=dict)
    # a CUDA generation build: how many products took their norm, gated activation and residual
    # add into aotc's fused kernel ({"norm": N, "gated": N, "residual": N}); {} for none
    fused_products: dict = field(default_factory=dict)
    # the fused products' tiles the build chose by timing them on its GPU: {"tuned_on": GPU name,
    # "tiles": {"NxK dtype": {"tile": [BLOCK_N, BLOCK_K, warps], "us": ..., "rule_us": ...}}}; {}
    # for none. Another GPU of the same architecture runs the package correctly, maybe slower.
    product_tiles: dict = field(default_factory=dict)

    @property
    def model_file(self) -> str:
        return MODEL_FILES[self.backend]

    @classmethod
    def from_json(cls, data: object) -> Manifest:
        """Check every field a runtime reads; FieldError names the first that is missing or has the wrong type."""
        fields = Fields(data)
        version = fields.integer("format_version")
        # Format 1 had no `runtime` (no CUDA graphs or TF32 then) and recorded less of the signature.
        runtime = (
            RuntimeSettings.read(fields.object("runtime"))
            if version >= 2 or "runtime" in fields.data
            else RuntimeSettings()
        )
        backend = fields.choice("backend", tuple(MODEL_FILES), "aotinductor")
        files = fields.raw_object("files")
        if not all(isinstance(v, str) for v in files.values()):
            fields.fail("files", "is not an object of path -> sha256")
        if MODEL_FILES[backend] not in files:
            fields.fail("files", f"does not list {MODEL_FILES[backend]}")
        for rel in files:
            if not inside_package(rel):
                fields.fail("files", f"names {rel!r}, which is not a plain path inside the package")
        source = fields.value("source", None)
        signature = Signature.from_json(fields.object("signature"))
        specializations = fields.items("specializations", Specialization.read, [])
        generation = fields.value("generation", None)
        _check_specializations(fields, specializations, signature, files)
        product_tiles = fields.raw_object("product_tiles", {})
        # the runtimes read tuned_on (their note on another GPU): text, as the C++ runner reads it
        if product_tiles:
            fields.object("product_tiles").text("tuned_on")
        shared = fields.value("shared_weights", None)
        shared_weights = SharedWeights.read(fields.object("shared_weights")) if shared else None
        if shared_weights is not None:
            members = {s.package for s in specializations}
            if shared_weights.file not in files:
                fields.fail(
                    "shared_weights", f"names {shared_weights.file}, which files does not list"
                )
            if not set(shared_weights.programs) <= members | {"."}:
                fields.fail("shared_weights", "names a program that is neither '.' nor a member")
        return cls(
            aotc_version=fields.text("aotc_version"),
            created=fields.text("created"),
            toolchain=Toolchain.read(fields.object("toolchain")),
            device=Device.read(fields.object("device")),
            mode=fields.choice("mode", MODES),
            precision=fields.choice("precision", PRECISIONS),
            inductor_options=fields.raw_object("inductor_options"),
            runtime=runtime,
            signature=signature,
            files=dict(files),
            build_seconds=fields.number("build_seconds"),
            numeric_check=NumericCheck.read(fields.object("numeric_check")),
            model=fields.optional_text("model"),
            source=Source.read(fields.object("source")) if source is not None else None,
            size_bytes=fields.integer("size_bytes", None),
            build_phases=fields.raw_object("build_phases", {}),
            format_version=version,
            backend=backend,
            backend_options=fields.raw_object("backend_options", {}),
            varies_per_build=fields.raw_object("varies_per_build", {}),
            specializations=tuple(specializations),
            tuning=fields.raw_object("tuning", {}),
            quantization=fields.raw_object("quantization", {}),
            fused_products=fields.raw_object("fused_products", {}),
            product_tiles=product_tiles,
            generation=Generation.read(fields.object("generation"))
            if generation is not None
            else None,
            shared_weights=shared_weights,
        )

    def to_json(self) -> dict:
        data: dict = {
            "format_version": self.format_version,
            "aotc_version": self.aotc_version,
            "created": self.created,
            "model": self.model,
            "source": self.source.to_json() if self.source else None,
            "toolchain": self.toolchain.to_json(),
            "device": self.device.to_json(),
            "mode": self.mode,
            "precision": self.precision,
            "backend": self.backend,
            "backend_options": dict(self.backend_options),
            "inductor_options": dict(self.inductor_options),
            "runtime": self.runtime.to_json(),
            "signature": self.signature.to_json(),
            "build_seconds": self.build_seconds,
            "numeric_check": self.numeric_check.to_json()
            if self.numeric_check
            else dict(NumericCheck.PENDING),
            "build_phases": dict(self.build_phases),
            "size_bytes": self.size_bytes,
            "varies_per_build": dict(self.varies_per_build),
            "files": dict(self.files),
        }
        if self.specializations:  # a package without them reads exactly as before
            data["specializations"] = [s.to_json() for s in self.specializations]
        if self.tuning:
            data["tuning"] = dict(self.tuning)
        if self.quantization:
            data["quantization"] = dict(self.quantization)
        if self.fused_products:
            data["fused_products"] = dict(self.fused_products)
        if self.product_tiles:
            data["product_tiles"] = dict(self.product_tiles)
        if self.generation is not None:
            data["generation"] = self.generation.to_json()
        if self.shared_weights is not None:
            data["shared_weights"] = self.shared_weights.to_json()
        return {k: v for k, v in data.items() if v is not None or k == "model"}


def _check_specializations(
    fields: Fields, specializations: tuple, signature: Signature, files: dict
) -> None:
    """Each member names dims the signature has, at sizes inside their ranges, and a folder whose
    manifest the package's `files` lists (so the package's hashes cover the member too)."""
    seen = set()
    for index, member in enumerate(specializations):
        where = f"specializations[{index}]"
        for name, size in member.dims.items():
            if name not in signature.dims:
                fields.fail(where, f"names dim {_key(name)}, which the signature does not have")
            low, high = signature.dims[name]["min"], signature.dims[name]["max"]
            if not low <= size <= high:
                fields.fail(where, f"has {_key(name)}={size}, outside its range {low}..{high}")
        if f"{member.package}/{MANIFEST_NAME}" not in files:
            fields.fail(
                where, f"names {member.package!r}, whose {MANIFEST_NAME} `files` does not list"
            )
        key = tuple(sorted(member.dims.items()))
        if key in seen:
            fields.fail(where, f"repeats {member.label}")
        seen.add(key)
    if specializations and signature.state:
        fields.fail("specializations", "are not allowed on a package with state")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


MAX_MANIFEST_BYTES = 16 << 20  # far above any real manifest (a few KB); read no more than this


def package_files(folder: Path) -> list[str]:
    """Relative POSIX paths of every file under `folder` but the manifest and its signature: what
    `files` must list (the signature covers the manifest, which covers the rest)."""
    folder = Path(folder)
    found = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel not in (MANIFEST_NAME, SIGNATURE_FILE):
                found.append(rel)
    return sorted(found)


def hash_package_files(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` except the manifest itself, keyed by relative path."""
    return {rel: sha256_file(Path(folder) / rel) for rel in package_files(folder)}


_ZERO_HASH = "0" * 64


def manifest_text(manifest: Manifest) -> str:
    """manifest.json's text, its last field the sha256 of the text with that field's value zeroed."""
    return hashed_manifest_text(manifest.to_json())


def hashed_manifest_text(data: dict) -> str:
    """The text of a manifest given as JSON data, with its hash (tests use it to forge a manifest
    that passes the hash, as anyone can: the hash catches edits; a signature catches forgeries)."""
    data = {**{k: v for k, v in data.items() if k != HASH_FIELD}, HASH_FIELD: _ZERO_HASH}
    text = json.dumps(data, indent=2, default=str) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()
    return _with_hash(text, _ZERO_HASH, digest)


def _with_hash(text: str, old: str, new: str) -> str:
    # The field is written last, so its last occurrence is the top-level one; a string value that
    # merely contains these characters would have its quotes escaped and cannot match.
    marker = f'"{HASH_FIELD}": "{old}"'
    at = text.rfind(marker)
    return text[:at] + f'"{HASH_FIELD}": "{new}"' + text[at + len(marker) :] if at >= 0 else text


def _check_manifest_hash(path: Path, text: str, data: dict) -> None:
    """Refuse a manifest edited after the build (format 3 on: older manifests carry no hash)."""
    if data.get("format_version", 0) < 3:
        return
    recorded = data.get(HASH_FIELD)
    if not isinstance(recorded, str) or len(recorded) != 64:
        raise PackageError(
            f"{path} has no valid {HASH_FIELD}; rebuild the package with `aotc build --force`"
        )
    zeroed = _with_hash(text, recorded, _ZERO_HASH)
    actual = hashlib.sha256(zeroed.encode()).hexdigest()
    if zeroed == text or actual != recorded:
        raise PackageError(
            f"{path} was modified after the build: its {HASH_FIELD} is {recorded[:12]}..., its content "
            f"hashes to {actual[:12]}...; rebuild the package with `aotc build --force`"
        )


def model_contract(manifest: Manifest) -> dict:
    """What the compiled model was built as, embedded in it at build (CONTRACT_KEY) and compared
    with the manifest at load: the model cannot hold the manifest's hash (the manifest holds the
    model's), so it holds the manifest fields that describe it."""
    return {
        "signature": manifest.signature.to_json(),
        "source_sha256": manifest.source.sha256 if manifest.source else None,
        "mode": manifest.mode,
        "precision": manifest.precision,
        "device": manifest.device.type,
        # what the runtime does that changes what the model computes; cudnn_benchmark only picks
        # among cuDNN's algorithms for the same convolutions, and `aotc build --tune` decides it
        # after the compile, by timing the built model both ways
        "runtime": {"cuda_graphs": manifest.runtime.cuda_graphs, "tf32": manifest.runtime.tf32},
    }


def check_contract(folder: Path, manifest: Manifest, metadata: dict[str, str]) -> None:
    """Refuse a package whose manifest does not describe its compiled model (an edited signature,
    a swapped model.pt2), naming the first difference with both sides."""
    embedded = metadata.get(CONTRACT_KEY)
    if embedded is None:
        if manifest.format_version >= 3:
            raise PackageError(
                f"package {folder}: its {manifest.model_file} carries no aotc description (it was replaced by "
                "a model aotc did not build for this manifest); rebuild it with `aotc build --force`"
            )
        return  # a format-1/2 package, built before models carried one
    try:
        model_side = json.loads(embedded)
    except (json.JSONDecodeError, RecursionError):
        model_side = None
    difference = _first_difference(model_contract(manifest), model_side, "")
    if difference:
        where, ours, theirs = difference
        raise PackageError(
            f"package {folder}: manifest.json does not describe its compiled model: {where or 'the description'} "
            f"is {_short(ours)} in the manifest but {_short(theirs)} in {manifest.model_file} (an edited "
            "manifest or a swapped model); rebuild it with `aotc build --force`"
        )


def _first_difference(
    ours: object, theirs: object, where: str
) -> tuple[str, object, object] | None:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            found = _first_difference(
                ours.get(key), theirs.get(key), f"{where}.{_key(key)}" if where else _key(key)
            )
            if found:
                return found
        return None
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for index, (a, b) in enumerate(zip(ours, theirs)):
            found = _first_difference(a, b, f"{where}[{index}]")
            if found:
                return found
        return None
    same = (
        ours == theirs
        and type(ours) is type(theirs)
        or (
            isinstance(ours, (int, float))
            and isinstance(theirs, (int, float))
            and not isinstance(ours, bool)
            and not isinstance(theirs, bool)
            and ours == theirs
        )
    )
    return None if same else (where, ours, theirs)


def _key(key: str) -> str:
    # quoted when it would split the one-line error (a line break in a dim name)
    return key if key.isprintable() else repr(key)


def _short(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def read_manifest(folder: Path, signed: bytes | None = None) -> Manifest:
    """Read and check a package's manifest; every failure names the package, the field and the fix.
    `signed`: the bytes whose signature was just checked; the manifest read must be those bytes."""
    folder = Path(folder)
    if not folder.is_dir():
        hint = (
            " (it is a file: pass the package folder that `aotc build` wrote)"
            if folder.exists()
            else ""
        )
        raise PackageError(
            f"package folder {folder} does not exist{hint}; build one with `aotc build ARTIFACT.pt2 -o {folder}`"
        )
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise PackageError(
            f"{folder} is not an aotc package: it has no {MANIFEST_NAME}; rebuild it with `aotc build`"
        )
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise PackageError(
                f"{path} is {path.stat().st_size} bytes, above the {MAX_MANIFEST_BYTES >> 20} MiB a manifest may have; "
                "rebuild the package with `aotc build`"
            )
        raw = path.read_bytes()
        if signed is not None and raw != signed:
            raise PackageError(
                f"{path} changed after its signature was checked; load the package again once "
                "nothing else writes it"
            )
        text = raw.decode()
        data = json.loads(text)
    # ValueError: json.loads refuses an integer of more than 4300 digits with a plain ValueError
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PackageError(
            f"{path} is not valid JSON ({type(exc).__name__}: {str(exc)[:100]}); rebuild the package with `aotc build`"
        ) from None
    if not isinstance(data, dict) or "format_version" not in data:
        raise PackageError(
            f"{path} is not an aotc manifest (no format_version); rebuild the package with `aotc build`"
        )
    version = data["format_version"]
    if version not in READABLE_VERSIONS:
        raise PackageError(
            f"{folder} has package format {shown(version)}, this runtime reads formats "
            f"{', '.join(map(str, READABLE_VERSIONS))}; "
            "rebuild the package with the aotc that matches this runtime"
        )
    _check_manifest_hash(path, text, data)
    try:
        manifest = Manifest.from_json(data)
    except FieldError as exc:
        raise PackageError(
            f"{path} is not a valid manifest: {exc}; rebuild the package with `aotc build --force`"
        ) from None
    # before anything is allocated from its numbers
    check_generation_record(folder, manifest.generation, manifest.signature, manifest.files)
    return manifest


def check_finished(folder: Path, manifest: Manifest) -> None:
    """Refuse a package whose build never finished its numeric check (a killed build's temporary folder)."""
    if manifest.numeric_check is None:
        raise PackageError(
            f"package {folder} was never finished: its build stopped before the numeric check; "
            "rebuild it with `aotc build --force`"
        )


def verify_files(folder: Path, manifest: Manifest) -> None:
    """Refuse a package whose files differ from what the manifest recorded at build time."""
    expected = manifest.files
    problems = []
    folder = Path(folder)
    for rel, digest in expected.items():
        path = folder / rel
        # Never follow a link (out of the folder, or to /proc) and never read anything but a regular file.
        if any(
            (folder / "/".join(rel.split("/")[: i + 1])).is_symlink()
            for i in range(rel.count("/") + 1)
        ):
            problems.append(f"{rel} is a symbolic link")
        elif not path.is_file() or not stat.S_ISREG(path.lstat().st_mode):
            problems.append(f"{rel} is missing")
        elif sha256_file(path) != digest:
            problems.append(f"{rel} was modified (sha256 differs from the manifest)")
    problems += [
        f"{rel} is not listed in the manifest"
        for rel in package_files(folder)
        if rel not in expected
    ]
    if problems:
        raise PackageError(
            f"package {folder} is damaged: {'; '.join(problems)}; rebuild it with `aotc build --force`"
        )
