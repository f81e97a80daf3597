"""The layers of ``src/maskserve/``, written once in the package docstring and kept equal to the
import-linter contract that ``tox -e style`` enforces on the imports.

The contract itself (setup.cfg, ``lint-imports``) fails when a lower layer imports a higher one;
these tests fail when the documented layers and the enforced ones drift apart. The docs'
Architecture page generates its layer table from the docstring (docs/hooks.py) and lists the files
by hand: the last test keeps that list whole.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from tests.docs_hooks import hooks
from tests.paths import ROOT

PACKAGE = ROOT / "src" / "maskserve"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def contract_layers() -> list[str]:
    """The layers of setup.cfg's import-linter layers contract, top first."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    contract = config["importlinter:contract:layers"]
    assert contract["containers"].strip() == "maskserve"
    assert contract["exhaustive"].strip().lower() == "true", "every module must sit in a layer"
    return [line.strip() for line in contract["layers"].strip().splitlines()]


def modules_in(layer: str) -> list[str]:
    return [name.strip() for name in re.split(r"[|:]", layer)]


def package_modules() -> set[str]:
    """The package's top-level modules and subpackages, as the contract names them."""
    found = {path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    found |= {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    return found


def test_the_enforced_contract_is_the_documented_table() -> None:
    assert [modules for modules, _ in hooks.docstring_layers()] == contract_layers()


def test_every_module_of_the_package_sits_in_exactly_one_layer() -> None:
    placed = [name for layer in contract_layers() for name in modules_in(layer)]
    assert len(placed) == len(set(placed)), "a module is in two layers"
    assert set(placed) == package_modules()


def source_modules() -> list[Path]:
    """Every module of the package, subpackages included, but the packages' own ``__init__``."""
    return sorted(path for path in PACKAGE.rglob("*.py") if path.name != "__init__.py")


def test_the_architecture_page_lists_every_module() -> None:
    files = ARCHITECTURE.read_text(encoding="utf-8").split("## The files", 1)[1].split("\n## ", 1)[0]
    for name in package_modules():
        shown = f"{name}/" if (PACKAGE / name).is_dir() else f"{name}.py"
        assert shown in files, f"docs/architecture.md's file list does not name {shown}"
    for path in source_modules():
        assert re.search(rf"\b{re.escape(path.name)}\b", files), (
            f"the file list does not name {path.relative_to(PACKAGE)}"
        )


def test_every_module_has_its_unit_test_file_in_the_mirror() -> None:
    """tests/unit/ mirrors src/maskserve/: ``serving/batcher.py`` is tested in
    ``tests/unit/serving/test_batcher.py``, ``__main__.py`` in ``tests/unit/test_main.py``."""
    missing = []
    for path in source_modules():
        relative = path.relative_to(PACKAGE)
        test = ROOT / "tests" / "unit" / relative.parent / f"test_{path.stem.strip('_')}.py"
        if not test.is_file():
            missing.append(str(test.relative_to(ROOT)))
    assert not missing, f"modules without their unit test file: {missing}"


def test_the_unit_tests_mirror_only_modules_that_exist() -> None:
    """A test file left behind by a renamed module would read as the module's tests."""
    modules = {(p.relative_to(PACKAGE).parent, p.stem.strip("_")) for p in source_modules()}
    # Tests of one behaviour across a package's modules (the engine's fidelity, threads, bfloat16).
    extra = {"test_fidelity.py", "test_bfloat16.py"}
    strays = [
        str(test.relative_to(ROOT))
        for test in (ROOT / "tests" / "unit").rglob("test_*.py")
        if (test.parent.relative_to(ROOT / "tests" / "unit"), test.stem.removeprefix("test_")) not in modules
        and test.name not in extra
    ]
    assert not strays, f"unit test files that mirror no module: {strays}"
