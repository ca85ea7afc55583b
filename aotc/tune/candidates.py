"""The build variants `--tune` tries, from configs/tune/<device>.yaml (one place to read and change)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

from aotc.config import CONFIGS_DIR, BuildConfig, load_yaml, reject_unknown
from aotc.errors import InternalError

BASELINE = "inductor"  # the first candidate: the build as it would be without --tune


@dataclass(frozen=True)
class Candidate:
    name: str
    backend: str = "aotinductor"
    options: dict = field(default_factory=dict)  # Inductor options over the mode's preset
    why: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "backend": self.backend, "options": dict(self.options)}


def select(candidates: list[Candidate], names: tuple, device: str) -> list[Candidate]:
    """The named candidates, in the file's order; the baseline always comes first."""
    if not names:
        return candidates
    known = {c.name for c in candidates}
    unknown = [n for n in names if n not in known]
    if unknown:
        from aotc.errors import UserInputError

        raise UserInputError(
            f"--tune-candidates: no candidate {', '.join(unknown)} for {device}; "
            f"choose from {', '.join(c.name for c in candidates)} (configs/tune/{device}.yaml)"
        )
    return [c for c in candidates if c.name == BASELINE or c.name in names]


def load_candidates(device: str) -> list[Candidate]:
    path = CONFIGS_DIR / "tune" / f"{device}.yaml"
    if not path.is_file():
        raise InternalError(
            f"tuning candidates {path} are missing from the aotc installation; reinstall aotc"
        )
    data = load_yaml(path)
    reject_unknown(data, {"candidates"}, f"tuning file {path}")
    found = []
    for item in data.get("candidates") or []:
        reject_unknown(item, {"name", "backend", "options", "why"}, f"a candidate in {path}")
        found.append(
            Candidate(
                str(item["name"]),
                str(item.get("backend", "aotinductor")),
                dict(item.get("options") or {}),
                " ".join(str(item.get("why", "")).split()),
            )
        )
    if not found or found[0].name != BASELINE:
        raise InternalError(f"{path} must list the '{BASELINE}' candidate first")
    return found


def skip_reason(candidate: Candidate, cfg: BuildConfig) -> str | None:
    """Why this candidate cannot be tried for this build (None: it can)."""
    if candidate.backend == "onnxruntime":
        if cfg.device != "cpu":
            return "ONNX Runtime is a CPU backend here (its CUDA build is not a dependency)"
        if cfg.precision.value != "fp32":
            return f"the ONNX Runtime backend builds fp32 only, this build is {cfg.precision.value}"
        if cfg.mode.value != "default":
            return (
                f"--mode {cfg.mode.value} is an Inductor mode; the ONNX Runtime backend takes none"
            )
        if any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime", "onnxscript")):
            return "needs the ONNX extra: pip install 'aotc[onnx]'"
    return None
