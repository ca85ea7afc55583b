"""scripts/decode_profile.py's measure of the time some kernel is on the GPU: the union of the
kernels' intervals, which holds under programmatic dependent launch, where kernels overlap."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "decode_profile.py"


@pytest.fixture(scope="module")
def busy_us():
    spec = importlib.util.spec_from_file_location("decode_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.busy_us


@pytest.mark.parametrize(
    ("intervals", "busy"),
    [
        ([], 0.0),
        ([(0.0, 2.0), (5.0, 6.0)], 3.0),  # apart: both, and the gap is idle
        ([(0.0, 2.0), (1.0, 3.0)], 3.0),  # a kernel launched early overlaps its predecessor
        ([(0.0, 10.0), (1.0, 3.0), (2.0, 4.0)], 10.0),  # inside another: nothing added
        ([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0)], 4.0),  # in any order
        ([(0.0, 1.0), (1.0, 2.0)], 2.0),  # back to back
    ],
)
def test_overlapping_kernels_count_once(busy_us, intervals, busy):
    assert busy_us(intervals) == busy
