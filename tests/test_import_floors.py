"""aotc's import floors: every module imports only from its own wing or from the floors below it.

Read from the source with `ast`: nothing is imported, so a module's import side effects cannot hide
or add an edge. Imports inside functions (lazy, for a fast `aotc --help`) and under TYPE_CHECKING
count too: they are dependencies all the same. docs/development.md describes the floors.
"""

from __future__ import annotations

import ast
import collections
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AOTC = ROOT / "aotc"
RUNTIME = ROOT / "runtime" / "aotc_runtime"

# Top floor first. A unit is a subpackage of aotc (aotc.tune), one of its top-level modules
# (aotc.errors), the package itself (aotc: __version__), or the runtime. The wings of one floor
# stand side by side: neither imports the other.
FLOORS: dict[str, tuple[tuple[str, ...], ...]] = {
    "cli": (("aotc.cli", "aotc.__main__"),),
    "api": (("aotc.api",),),
    "tune": (("aotc.tune",),),
    "bench": (("aotc.bench",),),
    "deploy": (("aotc.deploy",),),
    # explain beside the compiler: both read what export makes; explain writes nothing
    "compiler": (("aotc.compiler",), ("aotc.explain",)),
    "export": (("aotc.export",),),
    # the GPU kernels and their CPU references: export lowers its ops to them
    "kernels": (("aotc.kernels",),),
    # small shared leaves: one wing, so they may use each other (the circle test still applies)
    "base": (
        (
            "aotc",
            "aotc.errors",
            "aotc.config",
            "aotc.progress",
            "aotc.stage_estimates",
            "aotc.quiet",
            "aotc.env_vars",
            "aotc.cache_dir",
            "aotc.child_process",
            "aotc.optional",
            "aotc.math_mode",
            "aotc.quantize_schemes",
        ),
    ),
    "runtime": (("aotc_runtime",),),
}
LEVEL = {name: level for level, name in enumerate(FLOORS)}  # 0 = top
PLACE = {unit: (floor, wing) for floor, wings in FLOORS.items() for wing in wings for unit in wing}


@dataclass(frozen=True)
class Import:
    path: Path  # the importing file
    line: int
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (of aotc or aotc_runtime)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p, AOTC) for p in AOTC.rglob("*.py")} | {
    module_name(p, RUNTIME) for p in RUNTIME.rglob("*.py")
}


def module_of(name: str) -> str | None:
    """The module `name` is or is in (`aotc.x.y` for `from aotc.x import y` when y is a module, else
    `aotc.x`); None outside aotc and its runtime."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name if name in MODULES else None


def imports_of(path: Path, root: Path) -> list[Import]:
    """Every import of an aotc or aotc_runtime module in `path`, wherever it stands in the file."""
    source = module_name(path, root)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        targets = {module_of(name) for name in names} - {None, source}
        found += [Import(path, node.lineno, source, t) for t in sorted(targets)]  # type: ignore[arg-type]
    return found


def unit_of(module: str) -> str:
    if module == "aotc_runtime" or module.startswith("aotc_runtime."):
        return "aotc_runtime"
    return ".".join(module.split(".")[:2])


def aotc_imports() -> list[Import]:
    return [i for path in sorted(AOTC.rglob("*.py")) for i in imports_of(path, AOTC)]


def where(imp: Import) -> str:
    return f"{imp.path.relative_to(ROOT)}:{imp.line}"


def test_every_aotc_module_stands_on_a_floor():
    homeless = sorted(m for m in MODULES if unit_of(m) not in PLACE)
    assert not homeless, (
        f"{', '.join(homeless)}: on no floor; add its unit to FLOORS in {Path(__file__).name} "
        "(and to docs/development.md)"
    )


def test_no_module_imports_a_higher_floor_or_a_wing_beside_it():
    wrong = []
    for imp in aotc_imports():
        (floor, wing), (to_floor, to_wing) = PLACE[unit_of(imp.source)], PLACE[unit_of(imp.target)]
        if wing == to_wing or LEVEL[to_floor] > LEVEL[floor]:
            continue
        how = "a higher floor" if LEVEL[to_floor] < LEVEL[floor] else "a wing beside its own"
        wrong.append(
            f"{where(imp)}: {imp.source} (floor {floor}) imports {imp.target} "
            f"(floor {to_floor}), {how}"
        )
    assert not wrong, "imports against the floors:\n" + "\n".join(wrong)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in edges.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while not part or part[-1] != node:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def edge_lines(imports: list[Import], part: list[str], key) -> str:
    return "\n".join(
        f"  {where(i)}: {i.source} -> {i.target}"
        for i in imports
        if key(i.source) in part and key(i.target) in part and key(i.source) != key(i.target)
    )


def test_no_circle_between_aotc_units():
    """Units: subpackages and top-level modules. The floors leave room for one only inside a wing."""
    imports = [i for i in aotc_imports() if unit_of(i.target) != "aotc_runtime"]
    edges = collections.defaultdict(set)
    for i in imports:
        if unit_of(i.source) != unit_of(i.target):
            edges[unit_of(i.source)].add(unit_of(i.target))
    found = circles(edges)
    assert not found, "\n".join(
        f"circle {' <-> '.join(part)}:\n{edge_lines(imports, part, unit_of)}" for part in found
    )


def test_no_circle_between_aotc_modules():
    imports = [i for i in aotc_imports() if unit_of(i.target) != "aotc_runtime"]
    edges = collections.defaultdict(set)
    for i in imports:
        edges[i.source].add(i.target)
    found = circles(edges)
    assert not found, "\n".join(
        f"circle {' <-> '.join(part)}:\n{edge_lines(imports, part, lambda m: m)}" for part in found
    )


@pytest.mark.parametrize("path", sorted(RUNTIME.rglob("*.py")), ids=lambda p: p.name)
def test_runtime_imports_nothing_of_aotc(path):
    """The runtime is the ground floor: installed alone, it must never need the compiler side."""
    wrong = [i for i in imports_of(path, RUNTIME) if unit_of(i.target) != "aotc_runtime"]
    assert not wrong, "\n".join(
        f"{where(i)}: {i.source} (floor runtime) imports {i.target} (aotc, above it)" for i in wrong
    )
