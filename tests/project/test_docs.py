"""The docs stay true to the code: what docs/hooks.py generates covers everything, the pages ask
only for parts it makes, and what is written by hand names real headers, files and anchors.

``tox -e docs`` builds the site itself (``mkdocs build --strict``); these tests run without mkdocs,
in the fast suite, so a setting or an error added without its docs fails here too.
"""

from __future__ import annotations

import re
from pathlib import Path

from maskserve.config.flags import GROUPS, env_names, flag_names
from maskserve.config.settings import setting_fields
from tests.docs_hooks import hooks
from tests.paths import ROOT
from tests.project.test_layers import contract_layers

DOCS = ROOT / "docs"
HEADERS = (
    "X-Request-Id",
    "X-Queue-Time-Ms",
    "X-Inference-Time-Ms",
    "X-Batch-Size",
    "X-Text-Windows",
    "X-Request-Timeout",
    "Retry-After",
)
# A Markdown link to a file of the repository: [text](path) or [text](path#anchor), not a URL.
LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s#]+)(?:#([^)\s]+))?\)")


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def anchors(markdown: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub and mkdocs make them."""
    found = set()
    for title in re.findall(r"^#+ (.+)$", markdown.read_text(encoding="utf-8"), re.M):
        found.add(re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"))
    return found


def test_every_marker_in_the_pages_is_one_the_hooks_make() -> None:
    for page in pages():
        for line in page.read_text(encoding="utf-8").splitlines():
            if "<!-- generated" not in line:
                continue
            marker = hooks.MARKER.fullmatch(line)
            assert marker, f"{page.name}: a malformed marker: {line}"
            name, argument = marker.groups()
            if name in hooks.TABLES:
                assert argument is None, f"{page.name}: {name} takes no argument"
            else:
                assert name in hooks.FILES and argument, f"{page.name}: unknown marker {line}"
                hooks.generated(name, argument)  # the file it includes is there


def test_every_page_is_in_the_site_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in pages():
        assert f": {page.name}\n" in config, f"{page.name} is not in mkdocs.yml's nav"


def test_the_configuration_tables_show_every_flag_and_variable_once() -> None:
    tables = hooks.settings_tables()
    rows = [line for line in tables.splitlines() if line.startswith("| `--")]
    assert len(rows) == len(setting_fields())
    for f in setting_fields():
        for name in (*flag_names(f), *env_names(f)):
            assert f"`{name}`" in tables, name
    for title in GROUPS:
        assert f"### {title[0].upper()}{title[1:]}\n" in tables


def test_the_errors_table_shows_every_error_type_once() -> None:
    classes = hooks.error_classes()
    kinds = [cls.kind for cls in classes]
    assert len(kinds) == len(set(kinds)), "two errors share an error_type"
    table = hooks.errors_table()
    for cls in classes:
        assert f"| {cls.status} | `{cls.kind}` |" in table


def test_the_generated_route_list_is_the_route_table() -> None:
    from maskserve.http.routes import ROUTES

    rows = hooks.routes_table().splitlines()[2:]
    assert len(rows) == len(ROUTES)
    for row, route in zip(rows, ROUTES, strict=True):
        assert row.startswith(f"| `{route.method}` | `{route.operation().path}` |")
        assert row.endswith(f"| {hooks.ROLE_WORDS[route.role]} |")
    assert "<!-- generated: routes -->" in (ROOT / "docs" / "api.md").read_text(encoding="utf-8")


def test_the_generated_layer_table_is_the_enforced_contract() -> None:
    assert [modules for modules, _ in hooks.docstring_layers()] == contract_layers()
    assert len(hooks.layers_table().splitlines()) == len(contract_layers()) + 2


def test_the_openapi_reference_is_built_from_the_served_document() -> None:
    document = hooks.openapi_document()
    assert document["openapi"].startswith("3.1")
    assert "/v2/models/{model}/versions/{version}/infer" in document["paths"]


def test_the_api_page_documents_every_header() -> None:
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    for header in HEADERS:
        assert f"`{header}`" in api, header


def test_the_readme_and_contributing_links_reach_files_and_headings_that_exist() -> None:
    for doc in (ROOT / "README.md", ROOT / "CONTRIBUTING.md"):
        for target, anchor in LINK.findall(doc.read_text(encoding="utf-8")):
            path = (doc.parent / target).resolve()
            assert path.exists(), f"{doc.name} links to {target}, which does not exist"
            if anchor:
                assert anchor in anchors(path), f"{doc.name} links to {target}#{anchor}, which has no such heading"


def results(name: str) -> str:
    return (ROOT / "benchmarks" / "results" / name).read_text(encoding="utf-8")


def test_the_readme_figures_are_the_committed_benchmark_results() -> None:
    """The few figures the README shows (where a user chooses by them) are read from the result
    files they quote, so a rerun benchmark cannot leave the landing page stale."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    costliest = results("costliest.md")
    ratio = re.search(r"^\| ratio \| (\d+)x \|$", costliest, re.M)
    livez = re.search(r"^\| `/livez` meanwhile: .* \| [\d.]+ / ([\d.]+) / [\d.]+ ms \|$", costliest, re.M)
    assert ratio and livez
    assert f"takes {ratio.group(1)}× a full batch" in readme
    assert f"p99 {round(float(livez.group(1)))} ms" in readme
    row_figures = r"^\| 64 \| maskserve ([\w ]+) \| .* \| ([\d.]+×) \|$"
    # int8's and bfloat16's figures come from the run of the graphs as served today (int8's recipe
    # and bfloat16's float32 last layer came after the matrix of every backend).
    served = dict(re.findall(row_figures, results("precision-serving.md"), re.M))
    against_torch = {system: served[system] for system in ("openvino int8", "openvino bf16")}
    # float32's figures come from the run with the read-rows last layer in every backend.
    against_torch.update(
        {
            system: figure
            for system, figure in re.findall(row_figures, results("read-rows-c64.md"), re.M)
            if system in ("openvino", "onnxruntime")
        }
    )
    agreement = results("agreement.md")
    rows = {line.split(" | ")[1]: line for line in readme.splitlines() if line.startswith("| ")}
    for system, engine, flags in (
        ("openvino int8", "openvino int8", "--backend openvino --quantize int8"),
        ("openvino bf16", "openvino bfloat16", "--backend openvino --dtype bfloat16"),
        ("openvino", "openvino float32", "--backend openvino"),
        ("onnxruntime", "onnxruntime float32", "--backend onnxruntime"),
    ):
        row = rows[f"`{flags}`"]
        # Both kinds of sentences: the natural ones, then the short ones.
        top1 = [
            re.search(rf"^\| default [^|]* \| {engine} [^|]* \| {kind} \| \d+/\d+ \(([\d.]+)%\) \|", agreement, re.M)
            for kind in ("natural", "short")
        ]
        assert all(top1), engine
        figures = " | ".join(f"{float(found.group(1)):g}%" for found in top1 if found)
        assert row.split(" | ")[2].startswith(against_torch[system]), (row, against_torch[system])
        assert row.endswith(f"| {figures} |"), (row, figures)
    # int8 by class of CPU: each row's speed and agreement (natural, short sentences) are its class's
    # recipe's in the report. A class the report's CPU could not stand for (AMX, measured on a CPU
    # without it) is absent there, and the README says it was not measured.
    recipe = results("int8-recipe.md")
    measured_classes = 0
    for kernels, name in (("AMX", "vnni"), ("AVX-512 VNNI", "vnni"), ("AVX2", "avx2")):
        measured = re.search(
            rf"^\| \w+ \| {kernels} \| .*\(the `{name}` recipe\) \| \d+/\d+ \(([\d.]+)%\) \| .* "
            rf"\| \d+/\d+ \(([\d.]+)%\) \| ([\d.]+×) \|$",
            recipe,
            re.M,
        )
        [row] = [line for line in readme.splitlines() if line.startswith(f"| {kernels} ")]
        if measured is None:
            assert "not measured" in row, row
            continue
        measured_classes += 1
        natural, short, speed = measured.groups()
        assert row.endswith(f"| `{name}` | {speed} | {natural}% | {short}% |"), (row, measured.groups())
    assert measured_classes >= 2, "int8-recipe.md measures fewer than two classes of int8 kernels"


def test_the_readme_score_figure_is_the_committed_benchmark_result() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    fastest = re.search(r"^- the fastest backend \(maskserve openvino-int8\): ([\d.]+×)", results("score.md"), re.M)
    assert fastest, "score.md holds no figure for openvino int8 against minicons"
    assert f"`/score` scored {fastest.group(1)} the sentences per second" in readme


def test_the_several_models_figures_are_the_committed_benchmark_result() -> None:
    """The Several models page quotes its benchmark's report: a rerun cannot leave it stale."""
    page = " ".join((ROOT / "docs" / "models.md").read_text(encoding="utf-8").split())  # lines joined
    report = results("several-models.md")
    summaries = re.findall(
        r"^One server against two: flooded throughput ([\d.]+×), light throughput ([\d.]+×), "
        r"light p50 ([\d.]+×), memory ([\d.]+×) \((\d+) MiB less\)\.$",
        report,
        re.M,
    )
    assert len(summaries) == 2
    (small_flooded, large_flooded) = summaries
    assert f"used {small_flooded[3]} the memory of two servers" in page
    assert f"({small_flooded[4]} and {large_flooded[4]} MiB less" in page
    assert f"{small_flooded[1]} the answers per second of two servers and {small_flooded[2]} their median" in page
    assert f"for {small_flooded[0]} the" in page
    assert f"flooded model {large_flooded[0]} faster than two servers" in page
    rows = dict(re.findall(r"^\| (one server[^|]*|two servers[^|]*) \| (.*) \|$", report.split("### ")[2], re.M))
    one, two = rows["one server, two models"].split(" | "), rows["two servers, one model each"].split(" | ")
    capped = next(cells for layout, cells in rows.items() if "held to" in layout).split(" | ")
    assert f"{float(one[3]):.0f} ms median against {two[3]} ms" in page
    assert f"flooded model's ({float(one[1]):.0f} ms)" in page
    assert f"median to {float(capped[3]):.0f} ms" in page
    assert f"at {float(capped[0]) / float(one[0]):.2f}× the" in page
