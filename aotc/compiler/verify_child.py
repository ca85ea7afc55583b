"""Child process of the build's numeric check: load the package through the runtime and run it.

Runs in its own process so that a crash in native code (a segfault in the model .so) kills this
child, not the CLI; the parent turns the exit status into a BuildError.
usage: python -m aotc.compiler.verify_child PACKAGE INPUTS.pt OUTPUTS.pt CALLS
"""

import contextlib
import os
import sys


def main(package_path: str, inputs_path: str, outputs_path: str, calls: str) -> int:
    import torch

    import aotc_runtime
    from aotc.compiler.verify import STRICT_FP32_ENV
    from aotc.math_mode import strict_fp32
    from aotc_runtime import flatten_outputs

    cases = torch.load(inputs_path, weights_only=True)
    package = aotc_runtime.load(package_path, unfinished=True)  # the check is what finishes it
    strict = os.environ.get(STRICT_FP32_ENV) == "1"  # TF32 off, as the eager reference ran
    results = []
    with strict_fp32() if strict else contextlib.nullcontext(), torch.inference_mode():
        for tensors in cases:
            # Two calls per case (the parent says): a reduce-overhead package captures a CUDA
            # graph on the first call and replays it from the second on, so both paths are
            # checked, and a stateful model moves on at each call.
            for _call in range(int(calls)):
                results.append([t.detach().cpu() for t in flatten_outputs(package(*tensors))])
    torch.save(results, outputs_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
