"""The build's progress lines: the heartbeat with a stage's detail, and Inductor's tuning counters in words."""

import io
import re
import time

from aotc.compiler.profile import TuningProgress
from aotc.progress import Progress


def heartbeat_lines(detail) -> list:
    stream = io.StringIO()
    progress = Progress(stream=stream, heartbeat_s=0.02)
    with progress.stage("compiling", detail=detail):
        time.sleep(0.15)
    return [line for line in stream.getvalue().splitlines() if "still working" in line]


def test_heartbeat_says_how_far_the_stage_got():
    lines = heartbeat_lines(lambda: "3 GEMM/conv ops autotuned")
    assert lines and all(
        line.endswith("compiling: still working (0s, 3 GEMM/conv ops autotuned)") for line in lines
    )
    assert all(
        line.endswith("compiling: still working (0s)") for line in heartbeat_lines(lambda: "")
    )
    assert all(line.endswith("compiling: still working (0s)") for line in heartbeat_lines(None))


def test_tuning_progress_counts_from_its_own_start():
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    inductor["select_algorithm_autotune"] += 7  # tuning done before this build must not count
    tuning = TuningProgress()
    assert tuning() == ""
    try:
        inductor["select_algorithm_autotune"] += 2
        inductor["coordesc_tuning_bench"] += 15
        assert tuning() == "2 GEMM/conv ops autotuned, 15 coordinate-descent trials"
    finally:
        inductor["select_algorithm_autotune"] -= 9
        inductor["coordesc_tuning_bench"] -= 15


def test_heartbeat_lines_come_at_doubling_intervals_off_a_terminal():
    """A long stage in a log writes a few lines, not one per heartbeat: at 0.02 s, then 0.04,
    0.08, 0.16 s later (a line every 0.02 s would be 20)."""
    stream = io.StringIO()
    progress = Progress(stream=stream, heartbeat_s=0.02)
    with progress.stage("checking"):
        time.sleep(0.4)
    lines = [line for line in stream.getvalue().splitlines() if "still working" in line]
    assert 3 <= len(lines) <= 5, lines


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_heartbeat_is_one_line_redrawn_in_place():
    stream = Terminal()
    progress = Progress(stream=stream, heartbeat_s=0.02)
    with progress.stage("checking"):
        time.sleep(0.15)
    text = stream.getvalue()
    assert text.count("still working") >= 4  # redrawn at every heartbeat ...
    assert text.count("\n") == 2  # ... on one line: the stage's start and its end are the lines
    assert re.search(r"\r\x1b\[K\[aotc +[0-9.]+s\] checking: done in [0-9.]+s\n$", text), text
