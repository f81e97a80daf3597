"""docs/hooks.py (the docs site's mkdocs hooks, not in a package) loaded as a module, once, for the
tests that read what it generates."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

HOOKS = Path(__file__).resolve().parent.parent / "docs" / "hooks.py"


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", HOOKS)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()
