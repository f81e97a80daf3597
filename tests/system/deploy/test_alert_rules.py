"""deploy/prometheus/: the alert rules pass promtool and their unit tests, and say what to do.

prometheusrule.yaml is generated from maskserve.rules.yaml; rewrite it with
``python -m tests.system.deploy.test_alert_rules`` after editing the rules.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.system.deploy.manifests import ROOT
from tests.system.deploy.queries import RULES, alert_rules, exported_metrics, metric_names, selected_routes, selectors

pytestmark = pytest.mark.deploy

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
PROMETHEUS_RULE = PROMETHEUS_DIR / "prometheusrule.yaml"
UNIT_TESTS = Path(__file__).resolve().parent / "prometheus" / "maskserve.rules.test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"

PROMETHEUS_RULE_HEADER = """\
# maskserve's alert rules for the Prometheus Operator: maskserve.rules.yaml beside it, where each
# rule's reasons are written, as a PrometheusRule. Generated: edit maskserve.rules.yaml, then run
# `python -m tests.system.deploy.test_alert_rules`. Not in deploy/kubernetes' kustomization (its CRD
# comes with the Operator): kubectl apply -f deploy/prometheus/prometheusrule.yaml
# The Operator loads rules whose labels match its Prometheus' ruleSelector; add the label yours
# selects on (kube-prometheus-stack's default: `release: <its release name>`).
"""


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings (the longer expressions) as literal blocks, as they are written by hand."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_LiteralDumper.add_representer(str, _represent_str)


def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return loaded


def render_prometheus_rule() -> str:
    document = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "maskserve", "labels": {"app.kubernetes.io/name": "maskserve"}},
        "spec": {"groups": rules()["groups"]},
    }
    return PROMETHEUS_RULE_HEADER + yaml.dump(document, Dumper=_LiteralDumper, sort_keys=False, width=200)


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "tox -e deploy installs promtool first (.ci/ensure-prometheus: Debian's prometheus)"
    return found


def headings(markdown: Path) -> set[str]:
    """The anchors of a markdown file's headings, as GitHub and mkdocs make them."""
    anchors = set()
    for title in re.findall(r"^#+ (.+)$", markdown.read_text(encoding="utf-8"), re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"))
    return anchors


def test_promtool_finds_the_rules_valid() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_fire_as_their_unit_tests_expect() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", str(UNIT_TESTS)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_unit_tested_firing() -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert fired == {alert["alert"] for alert in alert_rules()}


def test_the_prometheus_rule_is_the_rules_file() -> None:
    assert PROMETHEUS_RULE.read_text(encoding="utf-8") == render_prometheus_rule(), (
        "prometheusrule.yaml differs from maskserve.rules.yaml: python -m tests.system.deploy.test_alert_rules"
    )


def test_every_alert_says_what_it_means_and_where_the_runbook_is() -> None:
    anchors = headings(OPERATIONS)
    for alert in alert_rules():
        name = alert["alert"]
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"], name
        # runbook_url: the annotation Alertmanager templates and Grafana's alert views link from.
        assert "runbook" not in annotations, f"{name}: runbook_url, not runbook"
        path, _, anchor = annotations["runbook_url"].partition("#")
        assert (ROOT / path) == OPERATIONS, (name, path)
        # One section per alert, under the alert's own name: the link survives any rewording.
        assert anchor == name.lower() and anchor in anchors, f"{name}: docs/operations.md has no section #{anchor}"


def test_the_rules_read_only_series_maskserve_exports() -> None:
    exported = exported_metrics() | {"up"}
    for alert in alert_rules():
        names = metric_names(alert["expr"])
        assert names and names <= exported, (alert["alert"], names - exported)


def test_the_rules_select_the_job_the_scrape_configs_make() -> None:
    # scrape-config.yaml names its job; the Operator names a ServiceMonitor's after the Service.
    scrape = yaml.safe_load((PROMETHEUS_DIR / "scrape-config.yaml").read_text(encoding="utf-8"))
    (job,) = scrape["scrape_configs"]
    service = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "service.yaml").read_text(encoding="utf-8"))
    assert job["job_name"] == service["metadata"]["name"] == "maskserve"
    for alert in alert_rules():
        for selector in selectors(alert["expr"]):
            assert 'job="maskserve"' in selector, (alert["alert"], selector)


def test_the_rules_and_the_dashboard_count_one_set_of_inference_routes() -> None:
    # One list, written out in every matcher: a route added to some and not others would make
    # the alerts and the panels disagree. (tests/unit/http/test_routes.py holds it to the route table.)
    (routes,) = selected_routes()
    assert {"fill_mask", "score", "demo", "demo_score"} <= routes


if __name__ == "__main__":
    PROMETHEUS_RULE.write_text(render_prometheus_rule(), encoding="utf-8")
    print(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)}")
