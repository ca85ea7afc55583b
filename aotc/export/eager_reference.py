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
    (if the model has any) carried from call to call, as the runtime carries it.

    The state is rounded to the dtypes `signature` gives it after each call: a bf16 package keeps
    its KV cache in bf16, and an fp32 reference whose cache kept every bit would drift from it
    step after step by more than the computation's own rounding."""
    import torch

    from aotc_runtime import flatten_outputs

    module = ep.module()
    n_outputs = len(signature["outputs"])
    device = cases[0][1][0].device if cases and cases[0][1] else "cpu"
    state = initial_state(ep, signature, device)
    results = []
    with torch.no_grad():
        for label, tensors in cases:
            for _call in range(calls):
                try:
                    out = [t.detach() for t in flatten_outputs(module(*tensors, *state))]
                except Exception as exc:  # the model itself, not the package: say where
                    raise ModelError(
                        f"the exported model fails eagerly on the check's inputs at {label} "
                        f"({type(exc).__name__}: {first_line(exc)[:160]}); re-export it with a --dim range it supports"
                    ) from exc
                if state:
                    if not signature.get("state_in_place"):  # returned after the outputs
                        out, state = out[:n_outputs], out[n_outputs:]
                    state = [
                        t.to(getattr(torch, spec["dtype"])).to(t.dtype)
                        for t, spec in zip(state, signature["state"])
                    ]
                results.append([t.cpu() for t in out])
    return results
