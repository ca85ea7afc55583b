"""What a package is checked against: the check's input cases and the exported program's eager
outputs on them. The build's numeric check (aotc/compiler/verify.py), `aotc verify` and the ONNX
conversion's own check all compare with these.
"""

from __future__ import annotations

from collections.abc import Sequence

from aotc.errors import ModelError
from aotc.export.call_structure import initial_state
from aotc.export.user_frames import first_line

# Calls per input case, in the child and in the reference: a reduce-overhead package captures a CUDA
# graph on the first call and replays it from the second, and a stateful model moves on each call.
CALLS_PER_CASE = 2


def input_cases(
    ep, signature, device, extra_sizes: Sequence[dict] = (), task: dict | None = None
) -> list:
    """[(label, [tensors])]: the export's example inputs, then all dynamic dims at min and at max,
    then one case at each of `extra_sizes` (a --specialize package's members: the package routes
    those calls to them, so they are checked against the same eager program). A generation step
    (`task`) gets the calls of a generation instead: random inputs are not valid positions."""
    from aotc_runtime import Signature

    if task is not None:
        from aotc.export.text_generation import check_cases

        return check_cases(task, device)

    sig = Signature.from_json(signature)
    n_inputs = len(sig.inputs)  # the artifact's example inputs end with the initial state, if any
    example = (
        list(ep.example_inputs[0])[:n_inputs]
        if getattr(ep, "example_inputs", None)
        else sig.random_inputs(seed=0)
    )
    cases = [("example", [t.to(device) for t in example])]
    if sig.dims:
        for label, pick in (("min", "min"), ("max", "max")):
            sizes = {name: info[pick] for name, info in sig.dims.items()}
            cases.append(
                (
                    f"dims at {label} ({', '.join(f'{k}={v}' for k, v in sizes.items())})",
                    sig.random_inputs(seed=1, sizes=sizes, device=device),
                )
            )
    for sizes in extra_sizes:
        label = ", ".join(f"{k}={v}" for k, v in sizes.items())
        cases.append(
            (f"specialized at {label}", sig.random_inputs(seed=2, sizes=sizes, device=device))
        )
    return cases


def eager_outputs(ep, cases, signature, calls: int = CALLS_PER_CASE) -> list:
    """The program run eagerly as the package is run: each case `calls` times, in order, the state
    (if the model has any) carried from call to call, as the runtime carries it (EagerRun)."""
    run = EagerRun(ep, signature, cases[0][1][0].device if cases and cases[0][1] else "cpu")
    return [run.call(label, tensors) for label, tensors in cases for _call in range(calls)]


class EagerRun:
    """The exported program run eagerly one call at a time, its state carried from call to call as
    the runtime carries it: the check of a generation package picks each greedy step's tokens from
    the outputs of the step before (aotc/compiler/generation_check.py).

    The state is rounded to the dtypes `signature` gives it after each call: a bf16 package keeps
    its KV cache in bf16, and an fp32 reference whose cache kept every bit would drift from it
    step after step by more than the computation's own rounding."""

    def __init__(self, ep, signature, device):
        self.module = ep.module()
        self.signature = signature
        self.state = initial_state(ep, signature, device)

    def call(self, label: str, tensors) -> list:
        """The outputs of one call (on the CPU); the state moves on."""
        import torch

        from aotc_runtime import flatten_outputs

        with torch.no_grad():
            try:
                out = [t.detach() for t in flatten_outputs(self.module(*tensors, *self.state))]
            except Exception as exc:  # the model itself, not the package: say where
                raise ModelError(
                    f"the exported model fails eagerly on the check's inputs at {label} "
                    f"({type(exc).__name__}: {first_line(exc)[:160]}); {_refix(self.signature)}"
                ) from exc
        if self.state:
            if not self.signature.get("state_in_place"):  # returned after the outputs
                n_outputs = len(self.signature["outputs"])
                out, self.state = out[:n_outputs], out[n_outputs:]
            self.state = [
                t.to(getattr(torch, spec["dtype"])).to(t.dtype)
                for t, spec in zip(self.state, self.signature["state"])
            ]
        return [t.cpu() for t in out]


def _refix(signature: dict) -> str:
    """What to do when the exported program fails on the check's inputs. A generation step's
    inputs are the calls of a generation, valid by construction, and its export takes no --dim."""
    from aotc_runtime.generation_record import STEP_INPUTS

    names = {spec.get("name") for spec in signature.get("inputs", ())}
    if set(STEP_INPUTS) <= names:
        return (
            "re-export it with this aotc (`aotc export MODEL --task text-generation --max-seq-len N`); "
            "if that fails the same way, rerun with --verbose and report it"
        )
    return "re-export it with a --dim range it supports"
