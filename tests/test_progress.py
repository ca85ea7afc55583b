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


def test_on_a_terminal_a_run_is_one_line_redrawn_in_place():
    """Stages, their heartbeats and their ends all redraw one line; a note stays above it, and
    the run's last line gives every stage's time."""
    stream = Terminal()
    progress = Progress(stream=stream, heartbeat_s=0.02)
    with progress.stage("loading", key="load"):
        pass
    with progress.stage("checking", key="check"):
        time.sleep(0.15)
        progress.note("a note")
    text = stream.getvalue()
    assert text.count("still working") >= 4  # redrawn at every heartbeat ...
    assert text.count("\n") == 1  # ... on one line: only the note ends a line
    assert re.search(r"\r\x1b\[K\[aotc +[0-9.]+s\] checking: done in [0-9.]+s$", text), text
    # the note printed over the running stage's line, which is drawn again under it
    assert re.search(
        r"\r\x1b\[K\[aotc +[0-9.]+s\] a note\n\r\x1b\[K\[aotc +[0-9.]+s\] checking", text
    )
    progress.note(f"wrote it ({progress.breakdown()})")
    assert re.search(
        r"\r\x1b\[K\[aotc +[0-9.]+s\] wrote it \(load 0s, check 0s\)\n$", stream.getvalue()
    )
    progress.end()  # nothing left drawn: nothing to end
    assert stream.getvalue().endswith("check 0s)\n")


def test_a_stage_that_fails_keeps_its_line_and_says_it_stopped():
    stream = Terminal()
    progress = Progress(stream=stream, heartbeat_s=10)
    try:
        with progress.stage("compiling", key="compile"):
            raise RuntimeError("broken")
    except RuntimeError:
        pass
    assert re.search(r"compiling: stopped after [0-9.]+s\n$", stream.getvalue())


def planned_lines(plan: dict, stages: list, sleep: float = 0.0) -> list:
    stream = io.StringIO()
    progress = Progress(stream=stream, heartbeat_s=0.02)
    progress.set_plan(plan)
    for key in stages:
        with progress.stage(key, key=key):
            time.sleep(sleep)
    return stream.getvalue().splitlines()


def test_a_planned_stage_says_its_step_and_the_time_the_run_has_left():
    lines = planned_lines({"load": 20.0, "compile": 200.0, "check": 45.0}, ["load", "compile"])
    assert lines[0].endswith("] 1/3 load ... about 4 min left")  # 20 + 200 + 45 s
    assert lines[1].endswith("] 1/3 load: done in 0.0s")
    assert lines[2].endswith("] 2/3 compile ... about 4 min left")  # 200 + 45 s
    # an estimate not known yet: the step alone
    lines = planned_lines({"load": 20.0, "compile": None}, ["load", "compile"])
    assert lines[0].endswith("] 1/2 load ...") and lines[2].endswith("] 2/2 compile ...")


def test_a_stage_past_its_estimate_says_so_rather_than_counting_below_zero():
    lines = planned_lines({"check": 0.01}, ["check"], sleep=0.1)
    beats = [line for line in lines if "still working" in line]
    assert beats and all("past its estimate of 5s" in line for line in beats), beats
