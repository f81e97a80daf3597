"""Every PromQL query the deploy files hold: the alert rules, the Grafana dashboard, the adapter.

Read here once, for the offline checks (tests/system/deploy) and for the real Prometheus that evaluates
them all (tests/system/fleet/test_prometheus.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from tests.system.deploy.manifests import ROOT

RULES = ROOT / "deploy" / "prometheus" / "maskserve.rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "maskserve.json"
ADAPTER_RULES = ROOT / "deploy" / "kubernetes" / "prometheus-adapter-rules.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"


@dataclass(frozen=True)
class PanelQuery:
    """One target of one dashboard panel, with the row it sits under."""

    row: str
    panel: str
    ref_id: str
    expr: str


def alert_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def panels() -> list[tuple[str, dict[str, Any]]]:
    """(row title, panel) for every panel that is not a row, in the dashboard's order."""
    found: list[tuple[str, dict[str, Any]]] = []
    row = ""
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            found += [(row, inner) for inner in panel.get("panels", [])]  # a collapsed row keeps its own
        else:
            found.append((row, panel))
    return found


def panel_queries() -> list[PanelQuery]:
    return [
        PanelQuery(row, panel["title"], target["refId"], target["expr"])
        for row, panel in panels()
        for target in panel["targets"]
    ]


def grafana_expr(expr: str, *, namespace: str, pod: str = ".*", rate_interval: str = "1m", model: str = ".*") -> str:
    """A panel's query as Grafana sends it: its variables replaced. The pod and model variables'
    "All" is the dashboard's allValue; $__rate_interval is what Grafana derives from the scrape interval."""
    filled = expr.replace("$namespace", namespace).replace("$pod", pod).replace("$__rate_interval", rate_interval)
    filled = filled.replace("$model", model)
    assert "$" not in filled, f"a variable is left in {filled}"
    return filled


def adapter_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(ADAPTER_RULES.read_text(encoding="utf-8"))["rules"]
    return rules


def adapter_query(rule: dict[str, Any], *, namespace: str, pods: list[str]) -> str:
    """A rule's metricsQuery with its template filled as the Prometheus Adapter fills it for a
    pods metric: the series it matched, the namespace and the pods asked for, grouped by pod."""
    series = str(rule["seriesQuery"]).split("{", 1)[0]
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    query = str(rule["metricsQuery"])
    for placeholder, value in (("<<.Series>>", series), ("<<.LabelMatchers>>", matchers), ("<<.GroupBy>>", "pod")):
        assert placeholder in query, f"{rule['name']['as']}: no {placeholder} in {query}"
        query = query.replace(placeholder, value)
    assert "<<" not in query, query
    return query


def metrics_section() -> str:
    """The Metrics section of docs/operations.md, whose table tests/unit/observability/test_metrics.py keeps equal to
    what /metrics exports."""
    return OPERATIONS.read_text(encoding="utf-8").split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]


def exported_metrics() -> set[str]:
    """The series /metrics exports, by the operations page's metrics table (histograms with their
    suffixes) and the process collector's series that the page names beside it."""
    table = metrics_section()
    rows = re.findall(r"^\| `(maskserve_\w+)` \| (\w+) ", table, re.M)
    names = {name for name, _ in rows}
    names |= {name + suffix for name, kind in rows if kind == "histogram" for suffix in ("_bucket", "_sum", "_count")}
    names |= set(re.findall(r"`(process_[a-z_]+)`", table))
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: every identifier right before a selector."""
    return set(re.findall(r"\b([a-zA-Z_:][\w:]*)\{", expr))


def selectors(expr: str) -> list[str]:
    """The label matchers of every selector in an expression."""
    return re.findall(r"\{([^}]*)\}", expr)


def route_selections(expr: str) -> list[frozenset[str]]:
    """The route names each ``route=~"a|b"`` matcher of ``expr`` selects."""
    return [frozenset(names.split("|")) for names in re.findall(r'route=~"([^"]*)"', expr)]


def selected_routes() -> set[frozenset[str]]:
    """Every distinct set of routes the alert rules and the dashboard select (one, when they agree)."""
    exprs = [alert["expr"] for alert in alert_rules()] + [query.expr for query in panel_queries()]
    return {routes for expr in exprs for routes in route_selections(expr)}
