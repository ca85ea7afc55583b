"""`aotc explain` and the export problems it shares with `aotc export`: each case model in tests/models
is explained once (the library call the CLI makes); CLI tests check exit codes, --json and --graph;
two fixes are applied and the fixed models exported and built."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import MODELS, error_lines, invoke

from aotc.explain.render import render_report
from aotc.explain.report import ExplainConfig, explain_model
from aotc.export.problems import (
    CONTROL_FLOW,
    DATA_SHAPE,
    DIM_SPECIALIZED,
    NON_TORCH,
    _suggestion_flag,
    fixed_shape_flags,
)
from aotc.export.shapes import parse_dim, parse_shape

# name -> (model file, flags as for `aotc export`)
CASES = {
    "control_flow": ("explain_control_flow.py", ["--input-shape", "10", "--input-shape", "10"]),
    "scipy": ("explain_scipy.py", ["--input-shape", "4x16"]),
    "disabled": ("explain_disabled.py", ["--entry", "fn", "--input-shape", "4x8"]),
    "item": ("explain_item.py", []),
    "print": ("explain_print.py", ["--input-shape", "4x8"]),
    "view": ("explain_view.py", ["--input-shape", "Bx32", "--dim", "B=1:64"]),
    "clean": ("explain_clean.py", ["--input-shape", "4x8"]),
    "two_branches": ("explain_two_branches.py", []),
}

# name -> (graphs, breaks: [(kind, marker of the line, word of the fix)], exportable,
#          export problems: [(kind, marker of the line, word of the fix)])
EXPECTED = {
    "control_flow": (
        2,
        [(CONTROL_FLOW, "if b.sum() < 0:", "torch.cond")],
        False,
        [(CONTROL_FLOW, "if b.sum() < 0:", "torch.cond")],
    ),
    "scipy": (
        None,
        [(NON_TORCH, "scipy.fft.dct", "torch.fft")],
        False,
        [(NON_TORCH, "scipy.fft.dct", "torch.fft")],
    ),
    "disabled": (
        2,
        [("compiler-disabled call", "y = helper(y)", "torch.compiler.disable")],
        True,
        [("compiler-disabled call", "y = helper(y)", "torch.compiler.disable")],
    ),
    "item": (
        2,
        [("scalar read from a tensor", ".item()", "capture_scalar_outputs")],
        False,
        [(DATA_SHAPE, ".item()", "torch._check")],
    ),
    "print": (2, [("print in forward", "print(", "remove the print")], True, []),
    "view": (1, [], False, [(DIM_SPECIALIZED, "x.view(16, -1)", "16 instead of B")]),
    "clean": (1, [], True, []),
    "two_branches": (
        None,
        None,
        False,
        [
            (CONTROL_FLOW, "if y.sum() > 0:", "torch.cond"),
            (CONTROL_FLOW, "if largest > 2:", "torch._check"),
        ],
    ),
}


def config(name: str, strict: bool = False) -> ExplainConfig:
    model, flags = CASES[name]
    shapes = [parse_shape(v) for f, v in zip(flags, flags[1:]) if f == "--input-shape"]
    dims = [parse_dim(v) for f, v in zip(flags, flags[1:]) if f == "--dim"]
    entry = flags[flags.index("--entry") + 1] if "--entry" in flags else None
    return ExplainConfig(
        model=str(MODELS / model),
        input_shapes=tuple(shapes),
        dims=tuple(dims),
        entry=entry,
        strict=strict,
    )


@pytest.fixture(scope="module")
def reports():
    """Each case explained once, lazily, shared by the tests of this module."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = explain_model(config(name))
        return cache[name]

    return get


def line_of(name: str, marker: str) -> int:
    lines = (MODELS / CASES[name][0]).read_text().splitlines()
    # Code lines are indented; the module docstring (which may quote the same code) is not.
    return next(
        number
        for number, text in enumerate(lines, start=1)
        if marker in text and text.startswith(" ")
    )


def assert_points_at(problem, name: str, marker: str, fix_word: str):
    assert problem.where is not None, problem
    assert Path(problem.where.file) == (MODELS / CASES[name][0]).resolve()
    assert problem.where.line == line_of(name, marker)
    assert marker in problem.where.source
    assert fix_word in problem.fix


@pytest.mark.parametrize("name", list(CASES))
def test_case_is_explained_at_the_users_line(reports, name):
    graphs, breaks, exportable, problems = EXPECTED[name]
    report = reports(name)
    if graphs is not None:
        assert report.jit.graph_count == graphs
        assert report.jit.break_count == graphs - 1
    for brk, (kind, marker, fix_word) in zip(report.jit.breaks, breaks or []):
        assert brk.problem.kind == kind
        assert_points_at(brk.problem, name, marker, fix_word)
    assert report.exportable is exportable
    assert len(report.findings) == len(problems), [f.problem for f in report.findings]
    for finding, (kind, marker, fix_word) in zip(report.findings, problems):
        assert finding.problem.kind == kind
        assert_points_at(finding.problem, name, marker, fix_word)


@pytest.mark.parametrize("name", list(CASES))
def test_text_names_file_line_and_fix(reports, name):
    report = reports(name)
    text = render_report(report)
    assert text.startswith(f"aotc explain {report.model}")
    for kind, marker, _fix_word in (EXPECTED[name][1] or []) + EXPECTED[name][3]:
        assert f"{MODELS.name}/{CASES[name][0]}:{line_of(name, marker)}" in text
        assert marker in text and kind in text
    assert text.splitlines()[-1].startswith("exportable" if report.exportable else "not exportable")
    # the model's print()s stay out
    assert "FakeTensor" not in text and "activation mean tensor" not in text


def test_scipy_breaks_inside_library_are_marked(reports):
    report = reports("scipy")
    assert report.jit.break_count >= 2
    inside = [b for b in report.jit.breaks if b.problem.where is None]
    assert inside and all(
        b.inside and "scipy" in b.inside.file and b.problem.kind == NON_TORCH for b in inside
    )
    assert "inside library code" in render_report(report)


def test_graph_ops_are_named_for_people(reports):
    report = reports("control_flow")
    assert report.jit.graphs[0].ops == [
        "torch.abs",
        "operator.add",
        "operator.truediv",
        "Tensor.sum",
        "operator.lt",
    ]
    assert report.jit.graphs[1].ops[-1] == "operator.mul"
    assert "graph 1: 5 ops: torch.abs, operator.add" in render_report(report)


def test_draft_export_lists_every_problem(reports):
    report = reports("two_branches")
    # torch.export alone reports only the first
    assert len(report.attempts["non-strict"].problems) == 2


def test_modes_only_one_accepts(reports):
    disabled, item = reports("disabled"), reports("item")
    assert disabled.attempts["non-strict"].ok and not disabled.attempts["strict"].ok
    assert disabled.findings[0].modes == ["strict"] and "[strict only]" in render_report(disabled)
    assert (
        item.hint and "--strict" in item.hint and "--strict" in render_report(item).splitlines()[-1]
    )


def test_strict_flag_judges_strict_mode():
    report = explain_model(config("disabled", strict=True))
    assert report.mode == "strict" and not report.exportable
    assert "without --strict" in report.hint


def test_dynamic_dim_fix_is_the_flags_to_pass(reports):
    finding = reports("view").findings[0]
    assert finding.problem.flags == ["--input-shape 16x32"]
    assert "x.view(x.shape[0], -1)" in finding.problem.fix


def test_cli_exit_codes_and_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # explain writes nothing: the folder stays empty
    model, flags = CASES["control_flow"]
    result = invoke("explain", MODELS / model, *flags, "--json")
    assert result.exit_code == 4, result.stderr
    assert (
        result.stderr.startswith("error: torch.export (non-strict) cannot capture")
        and "Traceback" not in result.stderr
    )
    data = json.loads(result.stdout)
    assert data["exportable"] is False and data["mode"] == "non-strict"
    assert data["jit"]["graph_count"] == 2 and data["jit"]["graph_break_count"] == 1
    brk = data["jit"]["breaks"][0]
    assert (
        brk["where"]["line"] == line_of("control_flow", "if b.sum()")
        and brk["torch_reason"]
        and brk["fix"]
    )
    assert data["jit"]["graphs"][0]["table"][0] == {
        "opcode": "placeholder",
        "name": "l_a_",
        "target": "L_a_",
        "args": "",
    }
    assert set(data["export"]) == {"non-strict", "strict"}
    assert data["problems"][0]["modes"] == ["non-strict", "strict"]
    assert data["inputs"] == [
        {"name": name, "shape": [10], "example": [10], "dtype": "float32"} for name in ("a", "b")
    ]
    assert list(tmp_path.iterdir()) == [] and "TORCH_DTRACE" not in os.environ


def test_cli_clean_model_exits_0_and_prints_graph_table():
    model, flags = CASES["clean"]
    result = invoke("explain", MODELS / model, *flags, "--graph")
    assert result.exit_code == 0, result.stderr
    assert "1 graph, 0 graph breaks" in result.stdout
    assert re.search(r"opcode\s+name\s+target\s+args", result.stdout)
    assert re.search(r"call_function\s+\S+\s+torch.nn.functional.linear", result.stdout)
    assert result.stdout.rstrip().endswith(
        "exportable: `aotc export` (non-strict) accepts the model"
    )


def test_cli_model_errors_keep_their_codes():
    assert invoke("explain", MODELS / "ctor_raises.py", "--input-shape", "2x4").exit_code == 3
    result = invoke(
        "explain", MODELS / "explain_clean.py", "--input-shape", "4x8", "--dim", "B=1:8"
    )
    assert result.exit_code == 2 and "--dim B names no dim" in result.stderr


def test_export_error_is_one_line_and_points_to_explain(tmp_path):
    model, flags = CASES["control_flow"]
    result = invoke("export", MODELS / model, *flags, "-o", tmp_path / "m.pt2")
    assert result.exit_code == 4
    (message,) = error_lines(result.stderr)
    assert f"{model}:{line_of('control_flow', 'if b.sum()')}: `if b.sum() < 0:`" in message
    assert "torch.cond" in message and "`aotc explain`" in message


def test_suggested_fix_wording():
    dims = {"B": parse_dim("B=1:64")}
    assert _suggestion_flag("B", "Dim('B', max=32)", {}, dims)[0] == "--dim B=1:32"
    flag, advice = _suggestion_flag("B", "2*_B", {"_B": "Dim('_B', min=1, max=32)"}, dims)
    assert flag is None and "multiple of 2" in advice
    text = "Constraints violated (B)!\nSuggested fixes:\n  B = 16\n\n"
    assert fixed_shape_flags(text, [("B", 32), ("B",)], dims) == [
        "--input-shape 16x32",
        "--input-shape 16",
    ]
    text = "Constraints violated (B)!\nSuggested fixes:\n  B = Dim('B', max=32)\n"
    assert fixed_shape_flags(text, [("B", 8)], dims) == ["--input-shape Bx8", "--dim B=1:32"]


def apply_cond_fix(source: str, line: int) -> str:
    """What the control-flow fix says: the `if` at `line` and its one-line body become one torch.cond."""
    lines = source.splitlines()
    condition = re.match(r"\s*if (.+):$", lines[line - 1]).group(1)
    target, body = re.match(r"\s*(\w+) = (.+)$", lines[line]).groups()
    indent = lines[line - 1][: len(lines[line - 1]) - len(lines[line - 1].lstrip())]
    lines[line - 1 : line + 1] = [
        f"{indent}{target} = torch.cond({condition}, lambda {target}: {body}, lambda {target}: "
        f"{target}.clone(), ({target},))"
    ]
    return "\n".join(lines) + "\n"


def export_and_build(tmp_path, model, flags):
    artifact, package = tmp_path / "fixed.pt2", tmp_path / "fixed_pkg"
    result = invoke("export", model, *flags, "-o", artifact)
    assert result.exit_code == 0, result.stderr
    result = invoke(
        "build", artifact, "--device", "cpu", "--mode", "default", "-o", package, "--quiet"
    )
    assert result.exit_code == 0, result.stderr
    assert (package / "manifest.json").is_file()


@pytest.mark.slow
def test_control_flow_fix_exports_and_builds(reports, tmp_path):
    finding = reports("control_flow").findings[0]
    assert "torch.cond" in finding.problem.fix
    fixed = tmp_path / "explain_control_flow_fixed.py"
    fixed.write_text(
        apply_cond_fix(Path(finding.problem.where.file).read_text(), finding.problem.where.line)
    )
    flags = CASES["control_flow"][1]
    result = invoke("explain", fixed, *flags)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "1 graph, 0 graph breaks" in result.stdout
    export_and_build(tmp_path, fixed, flags)


@pytest.mark.slow
def test_dynamic_dim_fix_exports_and_builds(reports, tmp_path):
    flags = " ".join(reports("view").findings[0].problem.flags).split()
    export_and_build(tmp_path, MODELS / CASES["view"][0], flags)
