"""`aotc verify`: re-check what a package claims, one check at a time, without trusting the build.

Checks, in order: the manifest reads and the build finished (and a text-generation package's record
agrees with its model); every file matches its sha256; the package was built for this torch,
platform and GPU; its signature (when a public key is given); it loads; the state it starts from
(a KV cache) is the export artifact's; and the build's numeric check, re-run against the export
artifact it was built from. A check
whose prerequisite failed is skipped, not failed, so the first failure is the one that matters.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aotc.errors import AotcError, AotcRuntimeError, NumericMismatchError, UserInputError

if TYPE_CHECKING:
    from aotc_runtime import Manifest, NumericCheck

CHECKS = ("manifest", "files", "compatibility", "signature", "load", "state", "numeric")


class VerificationFailed(AotcError):
    """One or more checks of `aotc verify` failed; the exit code is the first failure's."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

    @classmethod
    def of(cls, report: dict) -> VerificationFailed:
        failed = [c for c in report["checks"] if c["status"] == "failed"]
        names = ", ".join(c["name"] for c in failed)
        return cls(
            f"package {report['package']} failed {len(failed)} check(s) ({names}); the first: "
            f"{failed[0]['detail']}",
            failed[0]["exit_code"],
        )


def verify_package(
    package: Path, public_key: Path | None = None, artifact: Path | None = None
) -> dict:
    """The report: {package, ok, exit_code, checks: [{name, status, detail[, exit_code]}], numeric_check}."""
    return _Verification(Path(package), public_key, artifact).run()


class _Verification:
    def __init__(self, package: Path, public_key: Path | None, artifact: Path | None):
        self.package, self.public_key, self.artifact = package, public_key, artifact
        self.checks: list[dict] = []
        self.manifest: Manifest | None = None
        self.numeric: dict | None = None  # the re-run's figures, kept when the check fails too
        self._checked_artifact: Path | None = None  # hashed once for the state and numeric checks
        self._program: tuple | None = None  # its (program, metadata), loaded once for both

    def run(self) -> dict:
        if not self._check("manifest", self._manifest):
            for name in CHECKS[1:]:
                self._skip(name, "the manifest could not be read")
            return self._report()
        files = self._check("files", self._files)
        compatible = self._check("compatibility", self._compatibility)
        if self.public_key is not None:
            self._check("signature", self._signature)
        else:
            self._skip("signature", self._signature_not_asked())
        if not (files and compatible):
            reason = "the files" if not files else "the compatibility"
            for name in ("load", "state", "numeric"):
                self._skip(name, f"{reason} check failed")
        elif self._check("load", self._load):
            self._check("state", self._state)
            self._check("numeric", self._numeric)
        else:
            self._skip("state", "the package does not load")
            self._skip("numeric", "the package does not load")
        return self._report()

    def _report(self) -> dict:
        failed = [c for c in self.checks if c["status"] == "failed"]
        return {
            "package": str(self.package),
            "ok": not failed,
            "exit_code": failed[0]["exit_code"] if failed else 0,
            "checks": self.checks,
            "numeric_check": self.numeric,
        }

    def _check(self, name: str, check: Callable[[], str]) -> bool:
        """Run one check: its detail line when it passes; the error's message and exit code when not."""
        try:
            detail = check()
        except (AotcError, AotcRuntimeError) as exc:
            self.checks.append(
                {"name": name, "status": "failed", "detail": str(exc), "exit_code": exc.exit_code}
            )
            return False
        self.checks.append({"name": name, "status": "ok", "detail": detail})
        return True

    def _skip(self, name: str, why: str) -> None:
        self.checks.append({"name": name, "status": "skipped", "detail": why})

    def _manifest(self) -> str:
        from aotc_runtime import check_finished, read_manifest

        manifest = read_manifest(self.package)
        check_finished(self.package, manifest)
        self.manifest = manifest
        return (
            f"format {manifest.format_version}, built by aotc {manifest.aotc_version} at {manifest.created}: "
            f"{manifest.device.type}, {manifest.mode}, {manifest.precision}"
        )

    def _files(self) -> str:
        from aotc_runtime import verify_files

        verify_files(self.package, self._built())
        return f"{len(self._built().files)} file(s) match the manifest's sha256"

    def _compatibility(self) -> str:
        from aotc_runtime import check_compatible, running_environment

        manifest = self._built()
        check_compatible(manifest, self.package)
        running = running_environment()
        target = manifest.device.gpu_name or manifest.device.type
        return (
            f"built with torch {manifest.toolchain.torch} for {manifest.toolchain.platform or 'any platform'} "
            f"({target}); running torch {running['torch']} on {running['platform']}"
        )

    def _signature(self) -> str:
        from aotc_runtime import verify_signature

        key = self.public_key
        assert key is not None  # run() asks for this check only with a key
        verify_signature(self.package, key)
        return f"manifest.json is signed by the private key of {key}"

    def _signature_not_asked(self) -> str:
        from aotc_runtime import SIGNATURE_FILE

        signed = "signed" if (self.package / SIGNATURE_FILE).exists() else "not signed"
        return f"not asked (pass --public-key to check it); the package is {signed}"

    def _load(self) -> str:
        import aotc_runtime

        # The files were hashed by the check above; loading need not hash them again.
        package = aotc_runtime.load(self.package, verify=False)
        return f"loads through aotc_runtime on {package.device}"

    def _state(self) -> str:
        """The package's state.pt against the artifact's initial state, value for value: the
        numeric check starts every case from state.pt, so a planted one (NaN, or other values)
        would be checked against itself."""
        import torch

        from aotc.config import Precision
        from aotc.export.call_structure import initial_state
        from aotc.export.placement import state_in_precision
        from aotc_runtime import STATE_FILE, PackageError

        manifest = self._built()
        if not manifest.signature.state:
            return "the package carries no state"
        artifact = self._artifact(manifest)
        if artifact.suffix == ".onnx":
            return "an ONNX export holds no state to compare with"
        ep, meta = self._loaded_program(artifact)
        expected = state_in_precision(
            initial_state(ep, meta.signature, "cpu"), Precision(manifest.precision)
        )
        saved = torch.load(self.package / STATE_FILE, weights_only=True, map_location="cpu")
        for spec, want, got in zip(manifest.signature.state, expected, saved):
            if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
                raise PackageError(
                    f"package {self.package}: its {STATE_FILE} holds {spec.name} with other values "
                    f"than {artifact.name}'s initial state; rebuild it with `aotc build --force`"
                )
        return f"{len(expected)} state tensor(s) equal {artifact.name}'s initial state"

    def _numeric(self) -> str:
        manifest = self._built()
        artifact = self._artifact(manifest)
        recorded = manifest.numeric_check
        assert recorded is not None  # check_finished refused a package without one
        program = self._loaded_program(artifact) if artifact.suffix != ".onnx" else None
        check = rerun_numeric_check(self.package, manifest, artifact, program)
        outputs = compare_with_build(check, recorded)
        self.numeric = {"artifact": str(artifact), "cases": list(check.cases), "outputs": outputs}
        if not check.passed:
            raise NumericMismatchError(_mismatch_message(outputs, recorded.passed))
        worst = max(outputs, key=lambda o: o["max_abs"])
        return (
            f"re-run against {artifact.name} on {len(check.cases)} case(s): worst max abs {worst['max_abs']:.3g} "
            f"({worst['name']}; the build recorded {_figure(worst['recorded_max_abs'])}), within atol "
            f"{check.atol:g} rtol {check.rtol:g}{self._members_numeric(manifest, artifact)}"
        )

    def _members_numeric(self, manifest: Manifest, artifact: Path) -> str:
        """Each --specialize member was run above through the package's routing, against the user's
        artifact. Its own record is checked too: the static artifact it names must be the package's
        artifact re-exported at the member's sizes (a planted file is refused, not trusted)."""
        from aotc.compiler.specialize import derivation_problem
        from aotc_runtime import read_manifest, sha256_file

        if not manifest.specializations:
            return ""
        assert manifest.source is not None  # _artifact refused a package without one
        top_signature = manifest.signature.to_json()
        for spec in manifest.specializations:
            member = read_manifest(self.package / spec.package)
            source = Path(member.source.artifact) if member.source else None
            if (
                source is None
                or not source.is_file()
                or sha256_file(source) != member.source.sha256
            ):
                continue  # gone from the cache: the routed check above is the member's check
            problem = derivation_problem(source, manifest.source.sha256, top_signature, spec.dims)
            if problem:
                raise NumericMismatchError(
                    f"member {spec.package} ({spec.label}) was built from {source}, which is not "
                    f"{artifact.name} at {spec.label}: {problem}; rebuild the package with "
                    "`aotc build --force`"
                )
        assert self.numeric is not None  # set by _numeric before it asks for this
        self.numeric["members"] = [spec.label for spec in manifest.specializations]
        labels = ", ".join(self.numeric["members"])
        return f"; members {labels} run through the package's routing against {artifact.name}"

    def _loaded_program(self, artifact: Path) -> tuple:
        if self._program is None:
            from aotc.export.artifact import load_artifact

            self._program = load_artifact(artifact)
        return self._program

    def _artifact(self, manifest: Manifest) -> Path:
        """The export artifact the package was built from, checked by its sha256 (once)."""
        if self._checked_artifact is None:
            self._checked_artifact = self._find_artifact(manifest)
        return self._checked_artifact

    def _find_artifact(self, manifest: Manifest) -> Path:
        from aotc_runtime import sha256_file

        if manifest.source is None:
            raise UserInputError(
                f"package {self.package} records no export artifact and its sha256 (an older aotc built it), "
                "so the numeric check cannot be re-run against the program it was built from; rebuild it "
                "with `aotc build --force`"
            )
        artifact = self.artifact or Path(manifest.source.artifact)
        if not artifact.is_file():
            given = "" if self.artifact else " (where the build read it)"
            raise UserInputError(
                f"export artifact {artifact}{given} does not exist; pass --artifact with the .pt2 the "
                f"package was built from (sha256 {manifest.source.sha256[:16]}...)"
            )
        digest = sha256_file(artifact)
        if digest != manifest.source.sha256:
            raise UserInputError(
                f"export artifact {artifact} has sha256 {digest}, but package {self.package} was built from "
                f"one with sha256 {manifest.source.sha256}; pass --artifact with the .pt2 it was built from"
            )
        return artifact

    def _built(self) -> Manifest:
        assert self.manifest is not None  # every check but the first runs after it succeeded
        return self.manifest


def rerun_numeric_check(
    package: Path, manifest: Manifest, artifact: Path, program: tuple | None = None
) -> NumericCheck:
    """The build's numeric check (aotc/compiler/pipeline.py), run again on the finished package: the
    fp32 program as reference, the build's tolerance, TF32 off on both sides for fp32 on CUDA.
    A --specialize package is also run at each member's sizes, where it routes the call to the
    member, against the same program: every model in the folder answers to the user's artifact,
    never to a static artifact that was kept in the cache. `program`: the artifact's (program,
    metadata) when the caller has loaded it already."""
    from aotc.compiler.tolerances import scale_relative, tolerance
    from aotc.compiler.verify import check_numerics, reference_program
    from aotc.config import Precision
    from aotc.export.artifact import load_artifact
    from aotc.export.gptq import CALIBRATION_TOKENS, calibration_for
    from aotc.quantize_schemes import Quantization
    from aotc.quiet import quiet_torch

    recorded = manifest.numeric_check
    assert recorded is not None
    device = manifest.device.type
    member_sizes = [dict(spec.dims) for spec in manifest.specializations]
    if Path(artifact).suffix == ".onnx":  # an ONNX Runtime package built from an .onnx export
        from aotc.compiler.backends.onnxruntime import onnx_reference
        from aotc.export.onnx import read_onnx_model

        model, info = read_onnx_model(Path(artifact))
        atol, rtol = tolerance(manifest.precision, device, recorded.atol, recorded.rtol)
        with quiet_torch():
            return check_numerics(
                None,
                info.signature,
                package,
                device,
                atol,
                rtol,
                allow_mismatch=True,
                reference=onnx_reference(model),
                extra_sizes=member_sizes,
            )
    ep, meta = program or load_artifact(artifact)
    record = manifest.quantization
    quantization = (
        Quantization(
            record["scheme"],
            record.get("group_size"),
            tuple(record.get("skip") or ()),
            record.get("method") or "rtn",
        )
        if record
        else None
    )
    if quantization is not None and quantization.method == "gptq":
        # the levels are chosen again as the build chose them, on as many calibration tokens
        tokens = record.get("calibration", {}).get("tokens", CALIBRATION_TOKENS)
        quantization.calibration_chunks = calibration_for(artifact, meta, tokens)
    atol, rtol = tolerance(manifest.precision, device, recorded.atol, recorded.rtol)
    with quiet_torch():
        reference, checked = reference_program(
            ep, meta.signature, device, Precision(manifest.precision), quantization
        )
        strict = device == "cuda" and manifest.precision == Precision.FP32.value
        return check_numerics(
            reference,
            checked,
            package,
            device,
            atol,
            rtol,
            allow_mismatch=True,
            strict=strict,
            extra_sizes=member_sizes,
            task=meta.task,
            precision=manifest.precision,
            scale_relative=scale_relative(manifest.precision, record.get("scheme"), device),
        )


def compare_with_build(check: NumericCheck, recorded: NumericCheck) -> list[dict]:
    """Per output: the re-run's worst error beside the figures the build recorded."""
    built = {o.name: o for o in recorded.outputs}
    rows = []
    for out in check.outputs:
        then = built.get(out.name)
        rows.append(
            {
                "name": out.name,
                "max_abs": out.max_abs,
                "max_rel": out.max_rel,
                "atol": out.atol,
                "rtol": out.rtol,
                "ok": out.ok,
                "worst_case": out.worst_case,
                "recorded_max_abs": then.max_abs if then else None,
                "recorded_max_rel": then.max_rel if then else None,
            }
        )
    return rows


def _mismatch_message(outputs: list[dict], build_passed: bool) -> str:
    bad = max((o for o in outputs if not o["ok"]), key=lambda o: o["max_abs"])
    then = (
        f"the build recorded max abs {_figure(bad['recorded_max_abs'])}"
        if build_passed
        else "the build failed this check too and kept the package with --allow-mismatch"
    )
    return (
        f"package output '{bad['name']}' differs from eager by max abs {bad['max_abs']:.3g} (max rel "
        f"{bad['max_rel']:.3g}) at {bad['worst_case']}, above atol={bad['atol']:g} rtol={bad['rtol']:g} "
        f"({then}); rebuild it with `aotc build --force`"
    )


def _figure(value: float | None) -> str:
    return "nothing" if value is None else f"{value:.3g}"
