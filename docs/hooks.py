"""The docs site's generated parts, made from the code at build time so that they cannot drift.

mkdocs loads this file as a hook (``hooks:`` in mkdocs.yml). A page asks for a generated part
with a marker alone on its line, ``<!-- generated: NAME [ARGUMENT] -->``, which is replaced
before the page is rendered:

    settings              every setting, one table per --help group (flags.GROUPS)
    errors                every error_type, walked from the error tree (errors.py)
    layers                the layer table of the package docstring (maskserve/__init__.py)
    routes                every route of the route table (routes.ROUTES): method, path, what, who
    openapi               the OpenAPI document the server serves, rendered by essentials-openapi
    results FILE          a benchmark report from benchmarks/results/, its headings demoted
    file PATH             a file of the repository, as it is (CONTRIBUTING.md)

An unknown marker, or a file that is not there, stops the build. The site also gets the OpenAPI
document itself, as openapi.json. Only the standard library and maskserve are imported at the
top, so the tests can import this file without mkdocs; the OpenAPI part needs aiohttp and
essentials-openapi, which tox -e docs installs (docs/requirements.txt).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Without installing the package: maskserve's settings, errors and OpenAPI modules need no torch.
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

import maskserve  # noqa: E402
from maskserve import errors  # noqa: E402
from maskserve.config.bounds import follows_note  # noqa: E402
from maskserve.config.flags import GROUPS, env_names, flag_names  # noqa: E402
from maskserve.config.settings import Settings, setting_fields  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"^<!-- generated: (\w+)(?: ([\w./-]+))? -->$", re.M)


def _cell(text: str) -> str:
    """Text for one cell of a Markdown table: one line, no bare pipe, reST literals as Markdown."""
    return re.sub(r"``(.+?)``", r"`\1`", " ".join(text.split())).replace("|", "\\|")


def _default(value: object) -> str:
    if value is None or value == ():
        return "none"
    if value == "":
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _flags(f: dataclasses.Field[Any]) -> list[str]:
    if f.metadata.get("flag_kind") == "bool":
        return [f"--{f.name.replace('_', '-')}", f"--no-{f.name.replace('_', '-')}"]
    return list(flag_names(f))


def settings_tables() -> str:
    """One table per --help group, in its order: flags, environment variables, default, meaning."""
    fields = {f.name: f for f in setting_fields()}
    grouped = [name for names in GROUPS.values() for name in names]
    if sorted(grouped) != sorted(fields):
        raise ValueError(f"flags.GROUPS and the Settings fields differ: {sorted(set(grouped) ^ set(fields))}")
    parts = []
    for title, names in GROUPS.items():
        rows = [
            f"### {title[0].upper()}{title[1:]}",
            "",
            "| flag | environment | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for name in names:
            f = fields[name]
            flags = ", ".join(f"`{flag}`" for flag in _flags(f))
            env = ", ".join(f"`{variable}`" for variable in env_names(f))
            note = follows_note(name)
            default = f"`{_default(f.default)}`" + (f", {_cell(note)}" if note else "")
            rows.append(f"| {flags} | {env} | {default} | {_cell(f.metadata['help'])} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def error_classes() -> list[type[errors.MaskserveError]]:
    """Every error class a client may see, depth first in the order errors.py declares them."""
    found: list[type[errors.MaskserveError]] = []

    def walk(cls: type[errors.MaskserveError]) -> None:
        found.append(cls)
        for sub in cls.__subclasses__():
            if sub.__module__ == errors.__name__:
                walk(sub)

    walk(errors.MaskserveError)
    return found[1:]  # MaskserveError itself is never raised


def errors_table() -> str:
    """Every error_type: its status, and when it is answered (the class's docstring)."""
    rows = ["| status | `error_type` | when |", "| --- | --- | --- |"]
    for cls in error_classes():
        when = (cls.__doc__ or "").strip().split("\n\n", 1)[0]
        rows.append(f"| {cls.status} | `{cls.kind}` | {_cell(when)} |")
    return "\n".join(rows)


def docstring_layers() -> list[tuple[str, str]]:
    """(modules, job) per layer, top first, from the package docstring's table."""
    lines = (maskserve.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"\s+layer\s+job", line))
    rows: list[tuple[str, str]] = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        modules, job = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        rows.append((modules, job))
    return rows


def layers_table() -> str:
    rows = ["| layer | modules | job |", "| --- | --- | --- |"]
    layers = docstring_layers()
    for depth, (modules, job) in enumerate(layers):
        # A Markdown cell cannot hold a bare "|": the independent-siblings mark is escaped.
        shown = " ".join({"|": "\\|", ":": ":"}.get(part, f"`{part}`") for part in modules.split())
        rows.append(f"| {len(layers) - depth} | {shown} | {_cell(job)} |")
    return "\n".join(rows)


def openapi_document() -> dict[str, Any]:
    """The document GET /openapi.json serves with the default settings."""
    from maskserve.api.openapi import openapi_document as build
    from maskserve.http.routes import ROUTE_ROLES

    return build(Settings(), ROUTE_ROLES)


# How the stages treat each role of the route table (routes.Role; None: the rest).
ROLE_WORDS = {
    "inference": "model work: refused at the door (503) when it cannot be served in time",
    "form": "model work from a page form: a refusal is shown on the page",
    "public": "open without the API key",
    "control": "needs the control key (`--control-key`), which the API key does not grant",
    None: "needs the API key, when one is set",
}


def routes_table() -> str:
    """Every route in the route table's order, with its OpenAPI summary and what its role means."""
    from maskserve.http.routes import ROUTES

    rows = ["| method | path | what | treated as |", "| --- | --- | --- | --- |"]
    for route in ROUTES:
        summary = route.describe(Settings(), "[MASK]")["summary"]
        path = route.operation().path
        rows.append(f"| `{route.method}` | `{path}` | {_cell(summary)} | {ROLE_WORDS[route.role]} |")
    return "\n".join(rows)


def _demote(markdown: str, levels: int) -> str:
    """Every ATX heading outside code fences ``levels`` deeper."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


def openapi_markdown() -> str:
    from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler

    rendered = OpenAPIV3DocumentationHandler(openapi_document(), style="MKDOCS").write()
    rendered = re.sub(r"\A\s*<!--.*?-->\s*", "", rendered, flags=re.S)  # the renderer's own banner
    return _demote(rendered, 1)


def results(name: str) -> str:
    path = RESULTS / name
    if not path.is_file():
        raise FileNotFoundError(f"docs ask for benchmarks/results/{name}, which does not exist")
    return _demote(path.read_text(encoding="utf-8").strip(), 2) + f"\n\nFrom `benchmarks/results/{name}`."


def repository_file(name: str) -> str:
    path = (ROOT / name).resolve()
    if ROOT not in path.parents or not path.is_file():
        raise FileNotFoundError(f"docs ask for {name}, which is not a file of the repository")
    return path.read_text(encoding="utf-8")


# The markers that take no argument, and those that take one.
TABLES = {
    "settings": settings_tables,
    "errors": errors_table,
    "layers": layers_table,
    "routes": routes_table,
    "openapi": openapi_markdown,
}
FILES = {"results": results, "file": repository_file}


def generated(name: str, argument: str | None) -> str:
    """The Markdown a marker stands for."""
    if name in TABLES and argument is None:
        return TABLES[name]()
    if name in FILES and argument:
        return FILES[name](argument)
    raise ValueError(f"unknown marker <!-- generated: {name} {argument or ''} -->")


def expand(markdown: str) -> str:
    return MARKER.sub(lambda m: generated(m.group(1), m.group(2)), markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand(markdown)


def on_files(files: Any, config: Any, **_: Any) -> Any:
    """The OpenAPI document as a file of the site, so that pages can link to openapi.json."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "openapi.json", content=json.dumps(openapi_document(), indent=2) + "\n"))
    return files
