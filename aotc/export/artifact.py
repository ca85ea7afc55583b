"""The export artifact: a torch.export .pt2 with aotc's metadata (aotc.json) beside the program.

The one module that writes and reads it; build and bench load artifacts only through load_artifact.
Loading never runs code from the file: torch.export.load reads tensors and a serialized graph, and
a type it does not know is refused, not imported.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from aotc.errors import UserInputError
from aotc.export.user_frames import first_line
from aotc.quiet import quiet_torch

ARTIFACT_META = "aotc.json"
ARTIFACT_KIND = "aotc-export"


@dataclass(frozen=True)
class ArtifactMeta:
    """What `aotc export` stores beside the program: who made it, from which model, and the signature."""

    aotc_version: str
    torch: str
    model: str | None
    created: str
    signature: dict  # the JSON form of docs/package-format.md's `signature`
    kind: str = ARTIFACT_KIND
    # A --specialize artifact: {"sha256": of the artifact it was re-exported from, "sizes": {dim:
    # size}}. The build and `aotc verify` check it, so a planted file cannot pass for a member.
    derived_from: dict | None = None
    # A --task artifact: {"name": "text-generation", "batch_size", "max_seq_len", "vocab_size",
    # "eos_token_ids", "pad_token_id", "tokenizer", "chat_template", "special_tokens", ...}: what
    # the build's check and the runtime's loop need (text_generation.task_record).
    task: dict | None = None

    @classmethod
    def new(cls, model: str, signature: dict) -> ArtifactMeta:
        import torch

        from aotc import __version__

        return cls(
            __version__, torch.__version__, model, time.strftime("%Y-%m-%dT%H:%M:%S%z"), signature
        )

    def to_json(self) -> dict:
        data = {
            "kind": self.kind,
            "aotc_version": self.aotc_version,
            "torch": self.torch,
            "model": self.model,
            "created": self.created,
            "signature": self.signature,
        }
        if self.derived_from is not None:
            data["derived_from"] = self.derived_from
        if self.task is not None:
            data["task"] = self.task
        return data

    @classmethod
    def from_json(cls, data) -> ArtifactMeta | None:
        """The metadata, or None when `data` is not aotc's (another tool's .pt2, or a damaged entry)."""
        if (
            not isinstance(data, dict)
            or data.get("kind") != ARTIFACT_KIND
            or not isinstance(data.get("signature"), dict)
        ):
            return None
        return cls(
            str(data.get("aotc_version", "")),
            str(data.get("torch", "")),
            data.get("model"),
            str(data.get("created", "")),
            data["signature"],
            derived_from=data["derived_from"]
            if isinstance(data.get("derived_from"), dict)
            else None,
            task=data["task"] if isinstance(data.get("task"), dict) else None,
        )


def save_artifact(ep, meta: ArtifactMeta, output: Path, extra: dict | None = None) -> None:
    """torch.export.save to a temporary name beside the target, then rename (never half-written).
    `extra`: more files carried in the archive (a text-generation model's tokenizer and chat
    template)."""
    import torch

    from aotc_runtime import replaced_atomically

    files = {ARTIFACT_META: json.dumps(meta.to_json()), **(extra or {})}
    stored = _with_zero_state_stored_small(ep, meta.signature)
    with (
        replaced_atomically(output, suffix=".pt2") as tmp,
        quiet_torch(),
    ):  # torch.export.save wants a .pt2 name
        torch.export.save(stored, str(tmp), extra_files=files)


# A model's state (a KV cache) starts as zeros and is most of a generation artifact, twice: as the
# state's example inputs, and as the model's own cache buffers, which the program keeps among its
# constants (SmolLM2-135M at 8 rows of 2,048 positions: 2 x 755 MB of a 2.06 GB file). Each such
# tensor that is all zeros, at a declared state's shape, is stored as one zero expanded to its shape
# (torch.save keeps the view: one element), and loaded back as a tensor of zeros of that shape.


def _with_zero_state_stored_small(ep, signature: dict):
    """`ep` with each all-zero state example input replaced by a zero-stride view (a shallow copy
    of the program: the caller's is unchanged)."""
    import copy

    import torch

    examples = getattr(ep, "example_inputs", None)
    n_inputs = len(signature.get("inputs", ()))
    if not signature.get("state") or not examples:
        return ep
    shapes = {(tuple(spec["shape"]), spec["dtype"]) for spec in signature["state"]}

    def small(t):
        if not isinstance(t, torch.Tensor):  # a script object among the constants
            return t
        if (tuple(t.shape), str(t.dtype).removeprefix("torch.")) in shapes and not t.any():
            return torch.zeros((), dtype=t.dtype, device=t.device).expand(t.shape)
        return t

    args, kwargs = examples
    stored = copy.copy(ep)
    stored.example_inputs = (tuple(small(t) if i >= n_inputs else t for i, t in enumerate(args)),
                             kwargs)  # fmt: skip
    stored._constants = {name: small(t) for name, t in ep.constants.items()}
    return stored


def _zero_state_made_whole(ep, path: Path, signature: dict) -> None:
    """Each stored-small state input back as zeros of its shape, which must be the shape the
    signature gives that state (what a package allocates for it anyway): a small file cannot ask
    for more memory than the program it describes."""
    import torch

    n_inputs = len(signature.get("inputs", ()))
    states = signature.get("state") or []
    shapes = {tuple(spec.get("shape", ())) for spec in states}

    def whole(t, what: str, declared: bool):
        if not isinstance(t, torch.Tensor) or t.numel() <= 1 or 0 not in t.stride():
            return t
        if not declared or tuple(t.shape) not in shapes:
            raise UserInputError(
                f"{path}: {what} is stored as one value of shape {list(t.shape)}, which is not a "
                "state its signature declares; re-export the model with `aotc export`"
            )
        return torch.zeros(t.shape, dtype=t.dtype).copy_(t)

    examples = getattr(ep, "example_inputs", None)
    if examples:
        args, kwargs = examples
        ep.example_inputs = (tuple(whole(t, f"example input {i}", i >= n_inputs)
                                   for i, t in enumerate(args)), kwargs)  # fmt: skip
    for name, t in list(ep.constants.items()):
        ep.constants[name] = whole(t, f"constant {name}", True)


TOKENIZER_ENTRY = "aotc_tokenizer.json"  # a text-generation artifact's tokenizer (tokenizers' JSON)
CHAT_TEMPLATE_ENTRY = "aotc_chat_template.jinja"  # its chat template (Jinja text)
_MAX_TOKENIZER_BYTES = 256 << 20
_MAX_CHAT_TEMPLATE_BYTES = 1 << 20  # as export reads it (tokenizer_folder.py)


def read_artifact_tokenizer(path: Path) -> str | None:
    """The tokenizer a text-generation artifact carries (tokenizers' JSON text), or None."""
    return _read_entry(path, TOKENIZER_ENTRY, _MAX_TOKENIZER_BYTES, "tokenizer")


def read_artifact_chat_template(path: Path) -> str | None:
    """The chat template a text-generation artifact carries (Jinja text), or None."""
    return _read_entry(path, CHAT_TEMPLATE_ENTRY, _MAX_CHAT_TEMPLATE_BYTES, "chat template")


def _read_entry(path: Path, entry: str, limit: int, what: str) -> str | None:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.filename.endswith(f"/extra/{entry}"):
                if info.file_size > limit:
                    raise UserInputError(
                        f"{path}: its {what} entry is {info.file_size} bytes, over the "
                        f"{limit >> 20} MiB a {what} may take; re-export it"
                    )
                # read at most the limit: the size in the archive's directory is the writer's word
                with archive.open(info) as handle:
                    data = handle.read(limit + 1)
                if len(data) > limit:
                    raise UserInputError(
                        f"{path}: its {what} entry is over {limit >> 20} MiB; re-export it"
                    )
                try:
                    return data.decode("utf-8")
                except UnicodeDecodeError:
                    raise UserInputError(
                        f"{path}: its {what} entry is not UTF-8 text; re-export it"
                    ) from None
    return None


# Entries torch.export.load would unpickle (running whatever code the pickle names): weights or
# constants saved with use_pickle, torchbind objects (custom_obj_*) and opaque objects (opaque_obj_*).
# aotc's artifacts hold plain tensors only, so any of these is refused before torch reads the file.
_CODE_PREFIXES = ("custom_obj_", "opaque_obj_")
_MAX_CONFIG_BYTES = 64 << 20


def code_entries(path: Path) -> list:
    """Names of the archive's entries that loading would unpickle; [] for a plain-tensor artifact."""
    import zipfile

    found = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(("weights_config.json", "constants_config.json")):
                continue
            if info.file_size > _MAX_CONFIG_BYTES:
                return [f"{info.filename} (a {info.file_size}-byte config)"]
            try:
                config = json.loads(archive.read(info)).get("config", {})
                entries = config.items()
            except (ValueError, AttributeError):
                return [f"{info.filename} (not a readable config)"]
            for name, entry in entries:
                if not isinstance(entry, dict):
                    found.append(name)
                elif entry.get("use_pickle") or str(entry.get("path_name", "")).startswith(
                    _CODE_PREFIXES
                ):
                    found.append(name)
    return found


def read_artifact_meta(path: Path) -> ArtifactMeta:
    """Only the metadata (the signature) of an artifact, without deserializing its program: for
    callers that hand the file to a build which loads it fully (seconds for a large model)."""
    meta = peek_artifact_meta(path)
    if meta is None:  # the full load names what is wrong with the file
        return load_artifact(path)[1]
    return meta


MAX_PEEKED_META_BYTES = 16 << 20  # larger than any signature aotc writes: not read for a hint


def peek_artifact_meta(path: Path) -> ArtifactMeta | None:
    """The metadata if it reads as such, else None (never raises: for hints, such as estimates)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            info = next(
                i for i in archive.infolist() if i.filename.endswith(f"/extra/{ARTIFACT_META}")
            )
            if info.file_size > MAX_PEEKED_META_BYTES:
                return None
            return ArtifactMeta.from_json(json.loads(archive.read(info)))
    except Exception:  # any malformed file: the build's full load says what is wrong
        return None


def load_artifact(path: Path):
    """(ExportedProgram, ArtifactMeta) or a UserInputError that says this is not an aotc export artifact.

    Nothing in the file runs: entries torch would unpickle are refused before it reads the file.
    """
    import zipfile

    import torch

    if zipfile.is_zipfile(path):
        pickled = code_entries(path)
        if pickled:
            raise UserInputError(
                f"{path} holds pickled entries ({', '.join(pickled[:3])}), which would run code when loaded; "
                "aotc loads artifacts of plain tensors only: re-export the model with `aotc export`"
            )
    # generation artifacts call aotc's attention operator: registered before the graph is read
    import aotc.export.cached_attention  # noqa: F401

    extra = {ARTIFACT_META: ""}
    try:
        with quiet_torch():
            ep = torch.export.load(str(path), extra_files=extra)
    except Exception as exc:
        raise UserInputError(_unloadable_reason(path, exc)) from None
    try:
        meta = ArtifactMeta.from_json(json.loads(extra[ARTIFACT_META]))
    except (json.JSONDecodeError, TypeError):
        meta = None
    if meta is None:
        raise UserInputError(
            f"{path} is an ExportedProgram but not one written by `aotc export` (no signature); "
            "re-export it with `aotc export`"
        )
    _zero_state_made_whole(ep, path, meta.signature)
    return ep, meta


def _unloadable_reason(path: Path, exc: Exception) -> str:
    """Why torch.export.load refused the file, told apart: not an export archive at all, or one that
    names Python types this process does not know (an artifact from an older aotc, or from plain
    torch.export, whose call spec holds the model's own output class)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return (
            f"{path} is not a torch.export artifact (not a .pt2 archive); "
            f"create one with `aotc export MODEL -o {path.name}`"
        )
    unknown = next((text for text in _load_errors(path, exc) if "not registered" in text), None)
    if unknown:
        return (
            f"{path} is an export artifact whose inputs or outputs use Python types this process has not imported "
            f"({' '.join(unknown.split())[:160]}); re-export it with this aotc, whose artifacts hold "
            "only tensors and builtins"
        )
    return (
        f"{path} is a .pt2 archive that torch {_torch_version()} cannot load as an ExportedProgram "
        f"({type(exc).__name__}: {first_line(exc)[:120]}); re-export it with `aotc export` on this torch"
    )


def _torch_version() -> str:
    import torch

    return torch.__version__


def _load_errors(path: Path, exc: Exception) -> list:
    """The texts of the failure's exception chain, and of the archive reader's own error.

    torch.export.load only logs the reader's error (which names a type it cannot rebuild) and then
    raises "check the warnings above"; reading the archive again, on this error path only, recovers it.
    """
    texts, seen = [], exc
    while seen is not None and len(texts) < 10:
        texts.append(" ".join(str(seen).split()))
        seen = seen.__cause__ or seen.__context__
    try:
        from torch.export.pt2_archive._package import load_pt2

        with quiet_torch():
            load_pt2(str(path))
    except Exception as inner:  # the reader's own error: what the log line would have shown
        seen = inner
        while seen is not None and len(texts) < 20:
            texts.append(" ".join(str(seen).split()))
            seen = seen.__cause__ or seen.__context__
    return texts
