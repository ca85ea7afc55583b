"""A generation artifact's KV cache starts as zeros and is most of the file: it is stored as one
zero expanded to its shape and loaded back whole (aotc/export/artifact.py). The package built from
it is the one test_generate.py checks token for token; here, the file and what loading gives."""

from __future__ import annotations

import pytest
import torch

from aotc.errors import UserInputError
from aotc.export.artifact import load_artifact, save_artifact

pytestmark = pytest.mark.slow  # builds the package


@pytest.fixture(scope="module")
def artifact(generation_packages):
    package, _model = generation_packages["llama"]
    return package.parent / "llama.pt2"


def test_the_zero_cache_takes_no_room_and_loads_back_as_zeros_of_its_shape(artifact, tmp_path):
    ep, meta = load_artifact(artifact)
    n_inputs = len(meta.signature["inputs"])
    states = list(ep.example_inputs[0])[n_inputs:]
    specs = meta.signature["state"]
    assert len(states) == len(specs) > 0
    for state, spec in zip(states, specs):
        assert list(state.shape) == spec["shape"] and state.is_contiguous()
        assert not state.any()
    shapes = {tuple(spec["shape"]) for spec in specs}
    caches = [t for t in ep.constants.values() if tuple(t.shape) in shapes]  # the model's own
    assert caches and all(t.is_contiguous() and not t.any() for t in caches)
    cache_bytes = sum(s.numel() * s.element_size() for s in states + caches)
    whole = tmp_path / "whole.pt2"
    torch.export.save(ep, str(whole))  # the same program with its zeros written out
    saved = whole.stat().st_size - artifact.stat().st_size
    assert saved > 0.9 * cache_bytes, (saved, cache_bytes)  # the zeros are not in the file


def test_an_input_stored_as_one_value_that_is_no_declared_state_is_refused(artifact, tmp_path):
    """A crafted artifact whose small file would load as a large input: only the declared state
    may be stored so, at the shape its signature gives."""
    ep, meta = load_artifact(artifact)
    args, kwargs = ep.example_inputs
    ids = torch.zeros((), dtype=args[0].dtype).expand(args[0].shape)
    ep.example_inputs = ((ids, *args[1:]), kwargs)
    crafted = tmp_path / "crafted.pt2"
    save_artifact(ep, meta, crafted)
    with pytest.raises(UserInputError, match="example input 0 is stored as one value of shape"):
        load_artifact(crafted)
