"""`aotc build --tune` / `--specialize`: the variants, the search, and the package of the winners.

The package is the winning build of the dynamic model, as `aotc build` wrote it (its model, its
numeric check, its embedded contract unchanged), with each size's winner as a complete package in
specialized/<dim>-<size>/ and two more manifest fields: `specializations` (what the runtime
dispatches on) and `tuning` (every candidate, its options, build time, median, and why it lost).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from aotc.cache_dir import private_cache_root
from aotc.compiler.finish import BuildResult
from aotc.compiler.package_writer import commit, output_lock, staging_folder, write_manifest
from aotc.compiler.pipeline import prepare
from aotc.compiler.shared_weights import share_weights
from aotc.compiler.specialize import check_specialize, derivation_problem, specialized_artifact
from aotc.config import BuildConfig
from aotc.errors import AotcError, BuildError, NumericMismatchError, UserInputError
from aotc.export.artifact import read_artifact_meta
from aotc.tune.cache import TuneCache, key_of, machine_versions
from aotc.tune.candidates import BASELINE, Candidate, load_candidates, select, skip_reason
from aotc.tune.search import Trial, Variant, build_trials, choose, time_variant, trial_key
from aotc_runtime import Signature, Specialization, read_manifest, sha256_file, verify_files

MEMBERS_DIR = "specialized"


def build_tuned(cfg: BuildConfig, progress) -> BuildResult:
    """The package of the winners (aotc/api.py sends a --tune or --specialize build here)."""
    cfg = prepare(cfg, progress)
    if Path(cfg.artifact).suffix == ".pt2" and read_artifact_meta(Path(cfg.artifact)).task:
        # its members would be other generation steps, with a loop of their own to check
        raise UserInputError(
            f"{cfg.artifact} is a text-generation artifact: --tune and --specialize do not "
            "build those yet; build it without them"
        )
    try:
        return _build_tuned(cfg, progress)
    except UntrustedCacheEntries as failed:
        # Something taken from the cache (or derived from a planted artifact) does not compute
        # what the user's artifact computes: it is removed and the search runs once more, all of
        # it built afresh for those models. A second failure is the build's own and is reported.
        progress.warn(
            f"the assembled package failed its check against {cfg.artifact.name} "
            f"({failed.detail}); removed {len(failed.entries)} build cache entr(ies) it came from "
            "and building them again"
        )
        for entry in failed.entries:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        return _build_tuned(cfg, progress, retry=True)


class UntrustedCacheEntries(Exception):
    """The assembled package failed its check and some of it came from the cache."""

    def __init__(self, detail: str, entries: list[Path]):
        super().__init__(detail)
        self.detail, self.entries = detail, entries


def _build_tuned(cfg: BuildConfig, progress, retry: bool = False) -> BuildResult:
    started = time.monotonic()
    deadline = started + cfg.tune_budget_s if cfg.tune_budget_s else None
    with tempfile.TemporaryDirectory(prefix="aotc-tune-") as scratch:
        root = private_cache_root() / "tune"
        # Without --tune nothing is kept between runs: the builds go to a scratch folder.
        cache = TuneCache(root if cfg.tune else Path(scratch))
        base = {"artifact": sha256_file(cfg.artifact), **machine_versions(cfg.device)}
        variants = make_variants(cfg, base, root, progress)
        trials = make_trials(cfg, variants, base)
        runnable = [t for t in trials if t.status == "pending"]
        build_trials(runnable, cfg, cache, deadline, progress)
        reused = sum(t.cached for t in runnable)
        measured_from_cache = 0
        winners = {}
        for variant in variants:
            own = [t for t in trials if t.variant is variant]
            measured_from_cache += time_variant(own, cfg.device, cache, progress)
            winners[variant.label] = choose(own)
        main = winners[variants[0].label]
        if main is None:
            raise _failure(trials, variants[0])
        record = {
            "tuned": cfg.tune,
            "budget_s": cfg.tune_budget_s,
            "jobs": cfg.tune_jobs,
            "cut_by_budget": any(t.status in ("cut off", "not tried") for t in trials),
            "builds": len(runnable),
            "builds_from_cache": reused,
            "timings_from_cache": measured_from_cache,
            "variants": [
                {
                    "label": v.label,
                    "dims": v.sizes,
                    "package": _member_folder(v.sizes) if v.sizes else ".",
                    "chosen": _chosen_name(winners[v.label]),
                    "candidates": [t.to_json() for t in trials if t.variant is v],
                }
                for v in variants
            ],
        }
        members = [(v, winners[v.label]) for v in variants[1:]]
        result = assemble(cfg, main, members, record, started, progress, retry)
    _report(progress, result.manifest.tuning)
    return result


def make_variants(cfg: BuildConfig, base: dict, root: Path, progress) -> list[Variant]:
    """The dynamic model, then one static artifact per --specialize size (kept in the cache)."""
    meta = read_artifact_meta(cfg.artifact)
    signature = Signature.from_json(meta.signature)
    variants = [Variant("dynamic" if signature.dims else "static", cfg.artifact, {}, signature)]
    if not cfg.specialize:
        return variants
    name, sizes = cfg.specialize
    check_specialize(meta.signature, name, sizes)
    for size in sizes:
        dims = {name: size}
        # kept in the cache even without --tune: `aotc verify` checks a member's record against it
        path = root / "artifacts" / f"{key_of({**base, 'sizes': dims})}.pt2"
        reused = path.is_file()
        if reused:
            problem = derivation_problem(path, base["artifact"], meta.signature, dims)
            if problem:
                progress.warn(
                    f"the tune cache's artifact for {name}={size} is not {cfg.artifact.name} at "
                    f"that size ({problem}); removed it and specializing again"
                )
                path.unlink(missing_ok=True)
                reused = False
        if not reused:
            progress.note(f"specializing the artifact at {name}={size}")
            path.parent.mkdir(parents=True, exist_ok=True)
            specialized_artifact(cfg.artifact, dims, path)
        member = Signature.from_json(read_artifact_meta(path).signature)
        variants.append(Variant(f"{name}={size}", path, dims, member))
    return variants


def make_trials(cfg: BuildConfig, variants: list[Variant], base: dict) -> list[Trial]:
    """Round-robin: each candidate over all variants before the next candidate."""
    if cfg.tune:
        candidates = select(load_candidates(cfg.device), cfg.tune_candidates, cfg.device)
    else:
        candidates = [Candidate(BASELINE, cfg.backend)]
    if cfg.backend != "aotinductor":  # what was asked is the first candidate
        candidates = [Candidate(cfg.backend, cfg.backend)] + [
            c for c in candidates if c.backend != cfg.backend
        ]
    trials, seen = [], set()
    for candidate in candidates:
        # the user's --option is part of every candidate, over the candidate's own
        options = {**candidate.options, **cfg.options} if candidate.backend == "aotinductor" else {}
        identity = (candidate.backend, tuple(sorted(options.items(), key=str)))
        duplicate = identity in seen
        seen.add(identity)
        skipped = skip_reason(candidate, cfg)
        for variant in variants:
            trial = Trial(
                variant, candidate, options, trial_key(cfg, variant, candidate, options, base)
            )
            if duplicate:
                trial.status, trial.reason = "skipped", "the same build as an earlier candidate"
            elif skipped:
                trial.status, trial.reason = "skipped", skipped
            trials.append(trial)
    return trials


def assemble(
    cfg: BuildConfig,
    main: Trial,
    members: list,
    record: dict,
    started: float,
    progress,
    retry: bool = False,
) -> BuildResult:
    """The main winner's package, each member's winner inside it, the manifest with both fields;
    then the whole folder checked against the user's artifact before it is committed."""
    with output_lock(cfg.output), staging_folder(cfg.output) as staging:
        _copy_checked(main.package, staging, dirs_exist_ok=True)
        manifest = with_cudnn_benchmark(read_manifest(staging), main.cudnn_benchmark)
        specializations, dropped, used = [], [], [main]
        for variant, winner in members:
            if winner is None:  # the package builds from the others; the record says why
                entry = next(v for v in record["variants"] if v["dims"] == variant.sizes)
                why = "; ".join(
                    f"{c['name']}: {c['status']}" + (f" ({c['reason']})" if c["reason"] else "")
                    for c in entry["candidates"]
                )
                dropped.append(f"{variant.label}: runs the dynamic model; {why}")
                continue
            folder = _member_folder(variant.sizes)
            _copy_checked(winner.package, staging / folder)
            if winner.cudnn_benchmark:
                member = read_manifest(staging / folder)
                write_manifest(staging / folder, with_cudnn_benchmark(member, True))
            specializations.append(Specialization(dict(variant.sizes), folder))
            used.append(winner)
        record["dropped"] = dropped
        # the weights once for all of them, and each program's archive without its own copy
        programs = [(".", cfg.artifact)] + [
            (_member_folder(variant.sizes), variant.artifact)
            for variant, winner in members
            if winner is not None
        ]
        shared = share_weights(cfg, staging, programs) if specializations else None
        record["search_seconds"] = round(time.monotonic() - started, 2)
        record["package_bytes"] = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
        manifest = dataclasses.replace(
            manifest,
            specializations=tuple(specializations),
            shared_weights=shared,
            tuning=record,
            build_seconds=record["search_seconds"],
            varies_per_build={
                "fields": [*manifest.varies_per_build.get("fields", []), "tuning"],
                "why": manifest.varies_per_build.get("why", "")
                + "; tuning records measured times and whether the cache served them",
            },
        )
        manifest = write_manifest(staging, manifest)
        record["assembled_check"] = check_assembled(cfg, staging, manifest, used, retry, progress)
        # only the record changes: the files were hashed just above, and the check changed none
        manifest = write_manifest(
            staging, dataclasses.replace(manifest, tuning=record), hash_files=False
        )
        commit(staging, cfg.output)
    return BuildResult(cfg.output, manifest)


def _copy_checked(source: Path, target: Path, dirs_exist_ok: bool = False) -> None:
    """Copy a candidate's package, then check the copy against its own manifest: the copy is what
    gets used, so a file changed in the cache after the search looked at it is still caught."""
    shutil.copytree(source, target, dirs_exist_ok=dirs_exist_ok)
    verify_files(target, read_manifest(target))


def check_assembled(
    cfg: BuildConfig, staging: Path, manifest, used: list[Trial], retry: bool, progress
) -> dict:
    """The numeric check of the folder as it will be written, against eager of the user's artifact,
    with a case at every member's sizes (the package routes those calls to the member). Each model
    in it passed a check when it was built, but against what it was built from, and perhaps in
    another run: a cache entry or a specialized artifact changed since is caught here."""
    from aotc.deploy.verify_package import rerun_numeric_check

    try:
        with progress.stage("checking the assembled package against eager in a child process"):
            check = rerun_numeric_check(staging, manifest, cfg.artifact)
    except BuildError as exc:  # the child refused or crashed on a model (a contract mismatch)
        detail = str(exc)
    else:
        worst = max(check.outputs, key=lambda o: o.max_abs)
        if check.passed or cfg.allow_mismatch:
            return {
                "cases": list(check.cases),
                "passed": check.passed,
                "worst_max_abs": worst.max_abs,
                "worst_output": worst.name,
            }
        detail = (
            f"output '{worst.name}' differs by max abs {worst.max_abs:.3g} at {worst.worst_case}, "
            f"above atol={worst.atol:g} rtol={worst.rtol:g}"
        )
    entries = [t.package.parent for t in used if t.package is not None]
    entries += [t.variant.artifact for t in used if t.variant.sizes]
    if not retry:
        raise UntrustedCacheEntries(detail, entries)
    raise NumericMismatchError(
        f"the assembled package failed its check ({detail}), though every model in it was built "
        "afresh and passed its own check; rebuild without --specialize and report this"
    )


def with_cudnn_benchmark(manifest, enabled: bool):
    """The manifest with runtime.cudnn_benchmark on when the search found it faster (not part of
    the model's embedded contract: it picks among cuDNN's algorithms for the same convolutions)."""
    if not enabled or manifest.runtime.cudnn_benchmark:
        return manifest
    runtime = dataclasses.replace(manifest.runtime, cudnn_benchmark=True)
    return dataclasses.replace(manifest, runtime=runtime)


def _member_folder(sizes: dict) -> str:
    return f"{MEMBERS_DIR}/" + "_".join(f"{name}-{size}" for name, size in sizes.items())


def _chosen_name(trial: Trial | None) -> str | None:
    if trial is None:
        return None
    return trial.candidate.name + (" + cudnn-benchmark" if trial.cudnn_benchmark else "")


def _failure(trials: list[Trial], variant: Variant) -> AotcError:
    """No candidate of the package's own model passed: the first one's error, with its exit code."""
    own = [t for t in trials if t.variant is variant and t.status not in ("skipped",)]
    first = own[0] if own else None
    if first is not None and first.status == "over tolerance":
        return NumericMismatchError(first.reason)
    summary = "; ".join(f"{t.candidate.name}: {t.status} ({t.reason})" for t in own[:4])
    return BuildError(f"no candidate of the model built: {summary}")


def _report(progress, tuning: dict) -> None:
    for line in tuning["dropped"]:
        progress.note(f"tune: left out {line}")
