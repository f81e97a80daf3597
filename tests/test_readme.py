"""The README's tables are generated from the code and must stay in step with it.

Rewrite them in place with ``python -m tests.test_readme`` (only the text between the markers).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from maskserve import errors
from maskserve.settings import ENV_PREFIX, Settings, env_names, flag_names

from .test_layers import layer_table

README = Path(__file__).resolve().parent.parent / "README.md"
HEADERS = ("X-Request-Id", "X-Queue-Time-Ms", "X-Inference-Time-Ms", "X-Batch-Size", "X-Request-Timeout")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: object) -> str:
    if value is None:
        return "none"
    if value == "":
        return '""'
    if isinstance(value, bool):
        return "false" if not value else "true"
    return str(value)


def settings_table() -> str:
    """Markdown table of every setting: flag, environment variable, default, meaning."""
    rows = ["| flag | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(Settings):
        flags = ", ".join(f"`{name}`" for name in flag_names(f))
        env = ", ".join(f"`{name}`" for name in env_names(f))
        rows.append(f"| {flags} | {env} | `{_default(f.default)}` | {_cell(f.metadata['help'])} |")
    return "\n".join(rows)


def error_classes() -> list[type[errors.MaskserveError]]:
    """Every error class, depth first in the order they are declared (the tree in errors.py)."""
    found: list[type[errors.MaskserveError]] = []

    def walk(cls: type[errors.MaskserveError]) -> None:
        found.append(cls)
        for sub in cls.__subclasses__():
            if sub.__module__ == errors.__name__:
                walk(sub)

    walk(errors.MaskserveError)
    return found[1:]  # MaskserveError itself is never raised


def error_table() -> str:
    """Markdown table of every error kind: status, kind, when it is answered."""
    rows = ["| status | kind | when |", "| --- | --- | --- |"]
    for cls in error_classes():
        when = (cls.__doc__ or "").strip().splitlines()[0]
        rows.append(f"| {cls.status} | `{cls.kind}` | {_cell(when)} |")
    return "\n".join(rows)


def between(marker: str) -> str:
    """The README text between ``<!-- marker -->`` and ``<!-- /marker -->``."""
    found = re.search(rf"<!-- {marker} -->\n(.*?)\n<!-- /{marker} -->", README.read_text(encoding="utf-8"), re.S)
    assert found, f"README.md lacks the <!-- {marker} --> ... <!-- /{marker} --> block"
    return found.group(1).strip()


def test_every_setting_flag_is_in_the_configuration_table() -> None:
    table = between("settings-table")
    for f in dataclasses.fields(Settings):
        assert f"`--{f.name.replace('_', '-')}`" in table
        assert f"`{ENV_PREFIX}{f.name.upper()}`" in table


def test_configuration_table_matches_the_settings() -> None:
    assert between("settings-table") == settings_table(), "rewrite them: python -m tests.test_readme"


def test_error_kinds_table_matches_the_error_tree() -> None:
    assert between("error-kinds") == error_table(), "rewrite them: python -m tests.test_readme"


def test_layer_table_matches_the_package_docstring() -> None:
    assert between("layers") == layer_table(), "rewrite them: python -m tests.test_readme"


def test_every_error_kind_is_distinct() -> None:
    kinds = [cls.kind for cls in error_classes()]
    assert len(kinds) == len(set(kinds))


def test_api_section_documents_every_header() -> None:
    api = between("api")
    for header in HEADERS:
        assert header in api


def write_tables() -> None:
    """Replace the generated blocks of README.md, leaving every other line as it is."""
    text = README.read_text(encoding="utf-8")
    tables = (("settings-table", settings_table()), ("error-kinds", error_table()), ("layers", layer_table()))
    for marker, table in tables:
        block = re.compile(rf"(<!-- {marker} -->\n).*?(\n<!-- /{marker} -->)", re.S)
        assert block.search(text), f"README.md lacks the <!-- {marker} --> block"
        text = block.sub(lambda m, t=table: m.group(1) + t + m.group(2), text, count=1)
    README.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    write_tables()
