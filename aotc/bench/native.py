"""The C++ runner as an `aotc bench` contender (`--against cpp`).

`aotc-runner PKG --serve` keeps the package loaded in its own process and times calls on request,
so its timed slices interleave with the in-process contenders' like any other's. Its times are
the runner's own (CUDA events on GPU, a steady clock on CPU), as the others' are aotc_runtime's.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from aotc.errors import PackageError


class RunnerProcess:
    def __init__(self, package: Path):
        import torch

        from aotc.deploy.cpp_runner import runner_path
        from aotc_runtime import read_manifest

        self.input_names = read_manifest(package).signature.input_names
        self._work = tempfile.TemporaryDirectory(prefix="aotc-bench-cpp-")
        threads = str(torch.get_num_threads())  # those of this process's contenders
        self._proc = subprocess.Popen(
            [str(runner_path()), str(package), "--serve", "--threads", threads],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._answer()  # {"ready": true} once the package is loaded

    def _answer(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait()
            errors = self._proc.stderr.read().strip().splitlines()
            raise PackageError(
                f"the C++ runner stopped ({errors[-1] if errors else f'exit status {self._proc.returncode}'}); "
                "run `aotc run PKG --engine cpp` to see why, or leave cpp out of --against"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise PackageError(f"the C++ runner refused: {answer['error']}")
        return answer

    def _ask(self, command: str) -> dict:
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return self._answer()

    def use_inputs(self, inputs: list) -> float:
        """Send the inputs of a batch size (as .npz, by name); the runner makes its first call on them."""
        import numpy

        path = Path(self._work.name) / "inputs.npz"
        numpy.savez(
            path, **{name: t.detach().cpu().numpy() for name, t in zip(self.input_names, inputs)}
        )
        return float(self._ask(f"inputs {path}")["first_call_ms"])

    def time(self, count: int, warmup: int) -> list:
        return list(self._ask(f"time {count} {warmup}")["samples_ms"])

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write("quit\n")
                self._proc.stdin.flush()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
        self._work.cleanup()
