"""The package's modules stay small and their imports form no circle.

A module past a few hundred lines has grown a second job, to be split out under a name that says
it. A circle (a module that imports one that imports it back, directly or through others) makes
both ends one piece that no reader can take in order, and the layers' contract cannot see one
inside a layer: every import counts here, at the top of a module, inside a function or under
``TYPE_CHECKING``, as each is an arrow that a reader follows.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

from tests.paths import ROOT

PACKAGE = ROOT / "src" / "maskserve"
# The most lines a module may hold.
MOST_LINES = 400


def module_name(path: Path) -> str:
    """``src/maskserve/config/settings.py`` -> ``maskserve.config.settings``; a package's ``__init__``
    is named as its package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, source: str, known: Collection[str], *, package: bool = False) -> set[str]:
    """The package's modules that module ``name`` (its ``source``; ``package``: a package's
    ``__init__``) imports: for ``from a.b import c``, the module ``a.b.c`` when there is one, else
    ``a.b``; an import of anything outside the package names nothing."""
    here = name if package else name.rpartition(".")[0]
    found: set[str] = set()
    # ast.walk reaches every import: the module's, a function's, and those under TYPE_CHECKING.
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package, one level up per extra dot
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that reach each other through their imports (a strongly connected
    component of more than one), found by Tarjan's algorithm without recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, arrows = work[-1]
            for target in arrows:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def import_graph() -> dict[str, set[str]]:
    known = package_modules()
    return {
        name: imported(name, path.read_text(encoding="utf-8"), known, package=path.name == "__init__.py")
        for name, path in known.items()
    }


def test_no_module_of_the_package_passes_the_line_limit() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES
    }
    assert not long, f"modules past {MOST_LINES} lines, each with a second job to split out: {long}"


def test_no_modules_of_the_package_import_each_other_in_a_circle() -> None:
    graph = import_graph()
    found = [
        " ; ".join(f"{a} -> {b}" for a in circle for b in sorted(graph[a]) if b in circle) for circle in circles(graph)
    ]
    assert not found, f"import circles: {found}"


def test_the_circle_check_sees_imports_inside_functions_under_type_checking_and_relative() -> None:
    """The check itself: a circle closed only by a function's import, a TYPE_CHECKING one or a
    relative one is still a circle; one closed by nothing is none."""
    known = ("p", "p.a", "p.b", "p.c")
    graph = {"p": set[str](), "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": set[str]()}
    assert imported("p.c", "import os\nfrom p import b\n", known) == {"p.b"}
    assert circles(graph) == []
    for closing in (
        "def later() -> None:\n    from p import a\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import Thing\n",
        "from .a import Thing\n",
        "import p.a\n",
    ):
        graph["p.c"] = imported("p.c", closing, known)
        assert circles(graph) == [["p.a", "p.b", "p.c"]], closing
