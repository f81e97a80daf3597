"""deploy/grafana/maskserve.json: importable anywhere, reading only what maskserve exports, and
showing what an operator needs. tests/system/fleet/test_prometheus.py runs its queries for real."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.system.deploy.queries import (
    adapter_query,
    adapter_rules,
    dashboard,
    exported_metrics,
    grafana_expr,
    metric_names,
    panel_queries,
    panels,
)

pytestmark = pytest.mark.deploy

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# What the dashboard must show (issue: "The operations kit"), each as a query that shows it.
VIEWS = {
    "requests/s by status": r"sum by \(status\) \(rate\(maskserve_requests_total",
    "p50 latency": r"histogram_quantile\(0\.5, .*maskserve_request_duration_seconds_bucket",
    "p95 latency": r"histogram_quantile\(0\.95, .*maskserve_request_duration_seconds_bucket",
    "p99 latency": r"histogram_quantile\(0\.99, .*maskserve_request_duration_seconds_bucket",
    "queue depth": r"maskserve_queue_depth\{",
    "queue wait": r"histogram_quantile\(0\.99, .*maskserve_queue_wait_seconds_bucket",
    "batch size": r"maskserve_batch_size_(sum|bucket)",
    "padded tokens": r"maskserve_batch_padded_tokens_sum",
    "busy ratio": r"rate\(maskserve_inference_busy_seconds_total",
    "503 rate": r"maskserve_refused_requests_total",
    "504 rate": r'status="504"',
    "errors by kind": r'sum by \(kind\) \(rate\(maskserve_requests_total\{[^}]*kind!="ok"',
    "replicas": r'up\{job="maskserve"',
    "replicas ready": r"maskserve_ready\{",
}


def variables() -> dict[str, dict[str, object]]:
    return {v["name"]: v for v in dashboard()["templating"]["list"]}


def test_the_data_source_is_a_variable_every_panel_uses() -> None:
    source = variables()["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for _, panel in panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_namespace_pods_and_models_are_chosen_from_what_maskserve_exports() -> None:
    namespace, pod, model = variables()["namespace"], variables()["pod"], variables()["model"]
    assert model["multi"] is True and model["includeAll"] is True and model["allValue"] == ".*"
    for variable in (namespace, pod, model):
        assert variable["datasource"] == DATASOURCE
        assert 'label_values(maskserve_model_info{job="maskserve"' in str(variable["definition"])
    assert pod["multi"] is True and pod["includeAll"] is True
    # "All" sends a regex that matches every pod, the same one tests/system/fleet substitutes.
    assert pod["allValue"] == ".*"


def test_every_query_reads_maskserve_series_of_the_chosen_namespace() -> None:
    exported = exported_metrics() | {"up"}
    for query in panel_queries():
        names = metric_names(query.expr)
        assert names and names <= exported, (query.panel, names - exported)
        for name, matchers in re.findall(r"\b([a-zA-Z_:][\w:]*)\{([^}]*)\}", query.expr):
            assert 'job="maskserve"' in matchers and 'namespace="$namespace"' in matchers, (query.panel, matchers)
            # The chosen pods narrow every maskserve series; `up` counts the namespace's replicas.
            assert name == "up" or 'pod=~"$pod"' in matchers, (query.panel, matchers)


def test_every_query_and_the_adapter_rules_parse(tmp_path: Path) -> None:
    # promtool parses PromQL offline only inside rules: each query becomes a recording rule.
    queries = [grafana_expr(q.expr, namespace="default") for q in panel_queries()]
    queries += [adapter_query(rule, namespace="default", pods=["a", "b"]) for rule in adapter_rules()]
    rules = [{"record": f"query:{i}", "expr": expr} for i, expr in enumerate(queries)]
    path = tmp_path / "queries.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}), encoding="utf-8")
    promtool = shutil.which("promtool")
    assert promtool, "tox -e deploy installs promtool first (.ci/ensure-prometheus)"
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_shows_each_view_operators_need() -> None:
    exprs = [query.expr for query in panel_queries()]
    missing = [view for view, pattern in VIEWS.items() if not any(re.search(pattern, expr) for expr in exprs)]
    assert not missing


def test_it_has_a_fleet_row_a_per_model_row_and_a_per_pod_row_whose_queries_split_so() -> None:
    rows = {row for row, _ in panels()}
    assert len(rows) == 3
    per_pod = [q for q in panel_queries() if q.row == "Per pod"]
    assert per_pod and all(re.search(r"\bby \(pod\b", q.expr) for q in per_pod)
    per_model = [q for q in panel_queries() if q.row == "Per model"]
    assert per_model and all(re.search(r"\bby \(model\b", q.expr) for q in per_model)
    # The chosen models narrow every per-model query.
    assert all('model=~"$model"' in q.expr for q in per_model)
    fleet = [q for q in panel_queries() if q.row not in ("Per pod", "Per model")]
    assert fleet and not any(re.search(r"\bby \((pod|model)\b", q.expr) for q in fleet)


def test_the_busy_ratio_sums_a_threads_models() -> None:
    # One inference thread serves every model: its busy ratio is their busy seconds summed.
    busy = [q.expr for q in panel_queries() if q.row != "Per model" and "inference_busy" in q.expr]
    assert busy and all("sum without (model)" in expr or "sum by (pod)" in expr for expr in busy)


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    everything = dashboard()["panels"]
    ids = [panel["id"] for panel in everything]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in everything:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
    for _, panel in panels():
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
