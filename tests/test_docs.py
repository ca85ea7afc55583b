"""The README states what the code does: its exit-code table and its layout are checked against the code."""

import re
from pathlib import Path

import aotc_runtime
from aotc import errors

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def test_readme_exit_codes_match_the_code():
    rows = re.findall(r"^\| (\d+) \| (.+?) \|$", section("Exit codes"), re.M)
    assert [(int(code), text) for code, text in rows] == list(errors.EXIT_CODES)


def test_every_error_class_has_a_documented_exit_code():
    documented = {code for code, _text in errors.EXIT_CODES}
    classes = [
        getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)
    ]
    classes += [
        aotc_runtime.PackageError,
        aotc_runtime.InputMismatchError,
        aotc_runtime.AotcRuntimeError,
        aotc_runtime.NonFiniteLogitsError,
    ]
    for cls in classes:
        assert cls.exit_code in documented, cls


def test_readme_layout_names_every_subpackage():
    layout = section("Layout")
    subpackages = sorted(p.parent.name for p in (ROOT / "aotc").glob("*/__init__.py"))
    assert subpackages, "aotc has no subpackages"
    for name in subpackages:
        assert f"aotc/{name}/" in layout, f"README's Layout does not mention aotc/{name}/"
    for folder in re.findall(
        r"`((?:aotc|runtime|configs|scripts|tests|examples|docs)/[\w/]*)`", layout
    ):
        assert (ROOT / folder).exists(), f"README's Layout names {folder}, which does not exist"


def test_runtime_public_api_resolves():
    """Every name in aotc_runtime.__all__ is importable (the lazy table and __all__ agree)."""
    for name in aotc_runtime.__all__:
        assert getattr(aotc_runtime, name) is not None, name


def test_the_library_never_imports_the_cli():
    """aotc/cli/ parses flags and calls aotc.api; nothing outside it imports it (aotc/cpp_runner.py,
    now in aotc/deploy/, once imported aotc.cli.main: 14 modules in one import cycle)."""
    offenders = []
    for path in sorted((ROOT / "aotc").rglob("*.py")):
        inside = path.relative_to(ROOT / "aotc").parts
        if inside[0] == "cli" or inside == ("__main__.py",):  # the CLI and `python -m aotc`
            continue
        text = path.read_text()
        if re.search(
            r"^\s*(from aotc\.cli\b|import aotc\.cli\b|from aotc import cli\b)", text, re.M
        ):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [], offenders


def test_the_supported_transformers_range_is_stated_alike_everywhere():
    """The tested releases in the code's warning are the ones the requirements install, the
    extra declares from the oldest, and the README names."""
    import tomllib

    from aotc.export import transformers_release as release

    def pin(file: str) -> str:
        lines = (ROOT / file).read_text().splitlines()
        return next(line.split("==")[1] for line in lines if line.startswith("transformers=="))

    assert pin("requirements.txt") == release.OLDEST_TESTED
    assert pin("requirements-newest.txt") == release.NEWEST_TESTED
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"transformers{release.SUPPORTED}" in project["optional-dependencies"]["transformers"]
    assert f"{release.tested_range()} are tested" in " ".join(README.split())
