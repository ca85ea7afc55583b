"""Run the exported program at the edges of every --dim range, so a range the model cannot serve
fails at export with the flag that works, not at run time on a serving machine."""

from __future__ import annotations

from aotc.errors import UserInputError
from aotc.export.call_structure import initial_state
from aotc.export.example_call import ExampleCall
from aotc.export.user_frames import first_line
from aotc.quiet import quiet_torch


def _runs_at(module, signature, sizes: dict, state: list) -> Exception | None:
    """Run the exported program on random inputs with dims at `sizes`; the error, or None."""
    import torch

    inputs = signature.random_inputs(seed=0, sizes=sizes)
    try:
        with torch.no_grad(), quiet_torch():
            # a fresh copy per run: forward may update it
            module(*inputs, *[t.clone() for t in state])
        return None
    except Exception as exc:  # the model's own failure at that size, reported below
        return exc


def check_dim_ranges(ep, signature: dict, call: ExampleCall) -> None:
    """Run the program with each dynamic dim at its max and its min (the others at their example).

    torch.export proves only what shapes imply: a sequence longer than the position embeddings
    exports fine and fails at run time (index out of range). Found here, the error names the largest
    size that works (a bisection on that dim), as a flag to paste.
    """
    from aotc_runtime import Signature

    module, typed = ep.module(), Signature.from_json(signature)
    state = initial_state(ep, signature)
    example = {name: dim.example_size() for name, dim in call.dims.items()}
    for name, dim in call.dims.items():

        def runs(size: int, name: str = name) -> bool:
            return _runs_at(module, typed, {**example, name: size}, state) is None

        for edge, which in ((dim.max, "max"), (dim.min, "min")):
            failure = _runs_at(module, typed, {**example, name: edge}, state)
            if failure is None:
                continue
            # the example runs: bisect towards the edge
            works = _last_working(runs, good=dim.example_size(), bad=edge)
            flag = dim.flag(high=works) if which == "max" else dim.flag(low=works)
            raise UserInputError(
                f"the model fails with {name}={edge}, the {which} of --dim {name} ({type(failure).__name__}: "
                f"{first_line(failure)[:120]}); it runs {'up' if which == 'max' else 'down'} to {name}={works}: {flag}"
            )


def _last_working(runs, good: int, bad: int) -> int:
    """The size nearest `bad` for which runs(size) holds, between a size that runs and one that fails."""
    while abs(bad - good) > 1:
        middle = (good + bad) // 2
        if runs(middle):
            good = middle
        else:
            bad = middle
    return good
