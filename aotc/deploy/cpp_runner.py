"""The C++ runner (runtime/cpp): building it against the installed torch, and finding it.

`make runner` and the tests build it with `python -m aotc.deploy.cpp_runner build`; `aotc run --engine cpp`,
`aotc bench --against cpp` and `aotc bundle` find it with `runner_path()`: $AOTC_RUNNER (which must
name an executable aotc-runner; anything else is refused, exit 2), else the checkout's build
folder, else `aotc-runner` on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO

from aotc.errors import BuildError, UserInputError

RUNNER_ENV = "AOTC_RUNNER"
SOURCE_DIR = Path(__file__).resolve().parents[2] / "runtime" / "cpp"
BUILD_DIR = SOURCE_DIR / "build"
RUNNER_NAME = "aotc-runner"


def cmake_arguments() -> list[str]:
    """Where libtorch (the installed torch wheel) and nlohmann/json (PyPI `nlohmann-json`) are."""
    import torch.utils

    try:
        import nlohmann_json
    except ImportError:
        raise UserInputError(
            "building the C++ runner needs nlohmann-json; pip install nlohmann-json==3.12.0"
        ) from None
    include = Path(nlohmann_json.__file__).parent / "include"
    return [
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        f"-DNLOHMANN_JSON_INCLUDE_DIR={include}",
    ]


def build_runner(
    build_dir: Path = BUILD_DIR,
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Configure and build runtime/cpp; return the runner's path. Output of cmake goes to
    build_dir/build.log; `progress` gets a line per stage and each of the build's "[ 45%] ..."
    lines as they come (a build from scratch takes minutes on two cores: `make runner` shows them)."""
    if shutil.which("cmake") is None:
        raise UserInputError(
            "building the C++ runner needs cmake; apt-get install cmake (or pip install cmake)"
        )
    if not (SOURCE_DIR / "CMakeLists.txt").is_file():
        raise UserInputError(
            f"the C++ runner's source is not at {SOURCE_DIR}; build it from an aotc checkout"
        )
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / "build.log"
    import torch

    jobs = jobs or os.cpu_count() or 2
    steps = [
        (
            f"configuring (cmake, against the installed torch {torch.__version__})",
            ["cmake", "-S", str(SOURCE_DIR), "-B", str(build_dir), *cmake_arguments()],
        ),
        (
            f"compiling ({jobs} jobs; minutes from scratch, seconds after a change)",
            ["cmake", "--build", str(build_dir), "-j", str(jobs)],
        ),
    ]
    say = progress or (lambda line: None)
    with open(log, "w") as handle:
        for number, (what, step) in enumerate(steps, start=1):
            say(f"C++ runner {number}/{len(steps)}: {what}")
            if _run_logged(step, handle, say) != 0:
                raise BuildError(
                    f"building the C++ runner failed: {_first_error(log)}; the full log is {log}"
                )
    return build_dir / RUNNER_NAME


def _run_logged(command: list, log: IO[str], say: Callable[[str], None]) -> int:
    """Run `command` with its output into `log`; its progress lines ("[ 45%] Building CXX object
    ...", "[100%] Linking ...") also to `say`, as they come."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            log.write(line)
            log.flush()
            if line.startswith("["):
                say("  " + line.rstrip())
        return child.wait()


def _first_error(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    errors = [line.strip() for line in lines if "error" in line.lower()]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:300]


def runner_path() -> Path:
    """The aotc-runner to use, or a UserInputError that says how to build one."""
    chosen = os.environ.get(RUNNER_ENV)
    if chosen:
        problem = _not_a_program(Path(chosen))
        if problem:
            raise UserInputError(
                f"${RUNNER_ENV} is {chosen}, which {problem}; point {RUNNER_ENV} at the aotc-runner "
                f"that `make runner` builds ({BUILD_DIR / RUNNER_NAME}), or unset it"
            )
        return Path(chosen)
    built = BUILD_DIR / RUNNER_NAME
    if built.is_file():
        return built
    found = shutil.which(RUNNER_NAME)
    if found:
        return Path(found)
    raise UserInputError(
        f"the C++ runner is not built; run `make runner` in the aotc checkout, or set ${RUNNER_ENV} to an aotc-runner"
    )


def _not_a_program(path: Path) -> str:
    """Why `path` cannot be run as the runner ("" when it can): checked here, because starting it
    would fail inside subprocess with an OSError that reads as aotc's own bug."""
    if not path.exists():
        return "does not exist"
    if not path.is_file():
        return "is not a file"
    if not os.access(path, os.X_OK):
        return "is not executable"
    try:
        with open(path, "rb") as handle:
            start = handle.read(4)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if start != b"\x7fELF" and not start.startswith(b"#!"):
        return "is not a program (neither an ELF binary nor a script)"
    return ""


def main(argv: list[str]) -> int:
    if argv[:1] != ["build"]:
        print("usage: python -m aotc.deploy.cpp_runner build [BUILD_DIR]", file=sys.stderr)
        return 2
    # `make runner`'s entry: errors reported as the CLI reports them, without importing the CLI
    # (the library never does; it made aotc/ one import cycle of 14 modules)
    from aotc.errors import AotcError

    try:
        path = build_runner(
            Path(argv[1]) if len(argv) > 1 else BUILD_DIR,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except AotcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"built {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
