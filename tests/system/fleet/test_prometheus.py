"""The alert rules, the dashboard and the autoscaler's metric, on a real Prometheus scraping the
three replicas (scrape-config.yaml's relabelling; tests/system/fleet/prometheus.py says what stands in
for Kubernetes).

Under load through HAProxy, every alert expression, every dashboard query and both Prometheus
Adapter queries are evaluated through the HTTP API: each must parse, every panel must show data,
and every per-pod query must return each replica. Each replica must report itself ready and its
process's start time (the series of the not-ready and restart alerts), and no alert about a
replica's health may fire, or even be pending, under load. The adapter's busy ratio must rise when
the load starts and fall back once it stops, which its 1-minute window makes take about a minute.
Last, every panel is drawn from its queries over the whole load into artifacts/dashboard.png, the
picture of the dashboard in the docs: each panel must have drawn a line, each per-pod panel one
per replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from benchmarks.haproxy import HAProxy
from tests.system.deploy.queries import adapter_query, adapter_rules, alert_rules, grafana_expr, panel_queries
from tests.system.fleet.fleet import ARTIFACTS, CLIENTS, Replica, Workload, load_figures, record, steady_load
from tests.system.fleet.prometheus import INTERVAL, NAMESPACE, Prometheus, running_prometheus

if TYPE_CHECKING:
    from tests.system.fleet.dashboard_picture import PanelData

# serial: the fleet measures recovery and weights in time, and its balancer and Prometheus are one each.
pytestmark = [pytest.mark.fleet, pytest.mark.serial]

# Grafana's $__rate_interval is four scrape intervals at least; the windows here need only a few
# one-second scrapes.
RATE_INTERVAL = "10s"
# The adapter's busy ratio under load must pass this for every replica: an idle replica's stays at
# the probes' few milliseconds; one loaded for a few seconds passes it within its 1m window.
BUSY = 0.05
# The load lasts at least this long, so that its peak stands well clear of idle in the 1m window.
MIN_LOAD_S = 10.0
# Bounds of the waits: the rise takes seconds, the fall the adapter's 1m window.
RISE_TIMEOUT_S = 60.0
FALL_TIMEOUT_S = 120.0
# The alerts that say a replica is unwell rather than the fleet busy: none may fire, or even be
# pending, on healthy replicas under load (busy is not stuck, shedding is not unready).
REPLICA_ALERTS = (
    "MaskserveReplicaDown",
    "MaskserveNoReplicaUp",
    "MaskserveReplicaNotReady",
    "MaskserveInferenceStalled",
    "MaskserveRestarted",
)
# How far a replica's process_start_time_seconds may be from when the test spawned it: the kernel
# counts a process's start from its boot time, which it keeps in whole seconds.
START_TOLERANCE_S = 3.0
# The dashboard's picture: from a little before the load (as far back as Prometheus has scraped) to
# the busy ratio's fall, a point every two scrapes, so that a line has many points but stays smooth.
PICTURE_LEAD_S = 15.0
PICTURE_STEP_S = 2.0


def spawned_at(replica: Replica) -> float:
    """When the test spawned the replica's current process, in Unix time."""
    assert replica.server is not None
    return time.time() - (time.monotonic() - replica.server.started_at)


def busy_rule() -> dict[str, object]:
    (rule,) = [r for r in adapter_rules() if r["name"]["as"] == "maskserve_inference_busy_ratio"]
    return rule


async def evaluate_everything(prometheus: Prometheus, pods: list[str]) -> dict[str, int]:
    """Every query of the deploy files, asserted to parse and to show what it must."""
    for alert in alert_rules():
        await prometheus.query(alert["expr"])  # raises if it does not parse or evaluate
    shown: dict[str, int] = {}
    for query in panel_queries():
        result = await prometheus.query(grafana_expr(query.expr, namespace=NAMESPACE, rate_interval=RATE_INTERVAL))
        shown[query.panel] = shown.get(query.panel, 0) + len(result)
        if query.row == "Per pod":
            assert sorted(series["metric"]["pod"] for series in result) == pods, (query, result)
    # A panel may have a line with nothing to draw yet (no 504 so far), never a blank panel.
    assert all(shown.values()), {panel: n for panel, n in shown.items() if not n}
    for rule in adapter_rules():
        result = await prometheus.by_pod(adapter_query(rule, namespace=NAMESPACE, pods=pods))
        assert sorted(result) == pods, (rule["name"], result)
    rules = await prometheus.api("rules")
    evaluated = [rule for group in rules["groups"] for rule in group["rules"]]
    # Prometheus evaluated the rules file itself, every second, without an error.
    assert len(evaluated) == len(alert_rules())
    assert all(rule["health"] == "ok" for rule in evaluated), [r for r in evaluated if r["health"] != "ok"]
    return shown


async def draw_dashboard(prometheus: Prometheus, *, start: float, load: tuple[float, float]) -> list[PanelData]:
    """Every panel over ``start`` to now, drawn into artifacts/dashboard.png, the load shaded."""
    # matplotlib is installed in the fleet env only. Imported here, this module still imports (and
    # its test is deselected) in the envs that collect tests/system/fleet/ without running it.
    from tests.system.fleet import dashboard_picture

    end = time.time()
    rows, panels = dashboard_picture.layout()
    pictured = await dashboard_picture.query_panels(
        prometheus,
        panels,
        namespace=NAMESPACE,
        rate_interval=RATE_INTERVAL,
        start=start,
        end=end,
        step=PICTURE_STEP_S,
    )
    about = (
        f"Prometheus scrapes three replicas (tests/system/fleet); shaded: {CLIENTS} clients sending through HAProxy."
    )
    dashboard_picture.draw(
        pictured,
        rows,
        ARTIFACTS / "dashboard.png",
        start=start,
        end=end,
        step=PICTURE_STEP_S,
        about=about,
        shaded=load,
    )
    return pictured


async def test_every_alert_dashboard_and_adapter_query_runs_on_the_replicas(
    balancer: Callable[..., HAProxy], whole_fleet: list[Replica], workload: Workload, tmp_path: Path
) -> None:
    haproxy = balancer(l7_retries=False)
    pods = sorted(replica.name for replica in whole_fleet)
    busy = adapter_query(busy_rule(), namespace=NAMESPACE, pods=pods)
    began = time.monotonic()
    async with running_prometheus(tmp_path / "prometheus", whole_fleet) as prometheus:
        # The relabelling found each replica at its annotated port, as job, namespace and pod.
        _, up = await prometheus.wait_for(
            'up{job="maskserve"}', lambda up: sorted(up) == pods and all(up.values()), 30, "three targets up"
        )
        scraped_from = time.time()
        targets = (await prometheus.api("targets"))["activeTargets"]
        addresses = {t["labels"]["pod"]: t["labels"]["instance"] for t in targets}
        assert addresses == {r.name: f"{r.address.host}:{r.address.port}" for r in whole_fleet}
        assert all(t["labels"]["namespace"] == NAMESPACE and t["labels"]["job"] == "maskserve" for t in targets)
        # Each replica's own readiness and its process's start time, as the alerts read them.
        ready = await prometheus.by_pod('maskserve_ready{job="maskserve"}')
        started = await prometheus.by_pod('process_start_time_seconds{job="maskserve"}')
        spawned = {replica.name: spawned_at(replica) for replica in whole_fleet}
        assert sorted(started) == pods, started
        assert all(abs(started[pod] - spawned[pod]) < START_TOLERANCE_S for pod in pods), (started, spawned)
        # Two scrapes make a rate.
        _, idle = await prometheus.wait_for(busy, lambda b: sorted(b) == pods, 30, "a busy ratio per replica")
        assert max(idle.values()) < BUSY, idle

        load_from = time.time()  # the clients start before the block is entered (steady_load's warm-up)
        async with steady_load(haproxy.url, workload) as load:
            load_began = time.monotonic()
            rise_s, loaded = await prometheus.wait_for(
                busy, lambda b: sorted(b) == pods and min(b.values()) > BUSY, RISE_TIMEOUT_S, "busy under load"
            )
            shown = await evaluate_everything(prometheus, pods)
            await asyncio.sleep(MIN_LOAD_S - (time.monotonic() - load_began))
            peak = await prometheus.by_pod(busy)
            loaded_ready = await prometheus.by_pod('maskserve_ready{job="maskserve"}')
            unwell = await prometheus.query(f'ALERTS{{alertname=~"{"|".join(REPLICA_ALERTS)}"}}')
        load_to = time.time()
        fall_s, after = await prometheus.wait_for(
            busy,
            lambda b: sorted(b) == pods and all(b[pod] < peak[pod] / 2 for pod in pods),
            FALL_TIMEOUT_S,
            "busy falling once the load stopped",
        )
        pictured_at = time.monotonic()
        pictured = await draw_dashboard(
            prometheus, start=max(scraped_from, load_from - PICTURE_LEAD_S), load=(load_from, load_to)
        )
        picture_s = time.monotonic() - pictured_at
    result = load.result
    assert result is not None
    record(
        "prometheus",
        {
            **load_figures(result),
            "scrape_interval": INTERVAL,
            "queries": {
                "alerts": len(alert_rules()),
                "dashboard": len(panel_queries()),
                "adapter": len(adapter_rules()),
            },
            "series_per_panel": shown,
            "busy_idle": {pod: round(v, 3) for pod, v in idle.items()},
            "busy_rise_s": round(rise_s, 1),
            "busy_peak": {pod: round(v, 3) for pod, v in peak.items()},
            "busy_fall_s_after_stop": round(fall_s, 1),
            "busy_after": {pod: round(v, 3) for pod, v in after.items()},
            "picture_s": round(picture_s, 1),
            "test_s": round(time.monotonic() - began, 1),
        },
    )
    assert up == dict.fromkeys(pods, 1.0)
    assert ready == loaded_ready == dict.fromkeys(pods, 1.0)
    assert not unwell, [series["metric"] for series in unwell]
    assert min(loaded.values()) > BUSY and fall_s <= FALL_TIMEOUT_S
    # The load was real and right: every answer through HAProxy correct.
    assert result.sent > 0 and result.wrong == 0, load.report()
    # Every panel of the picture drew a line (two points at least), every per-pod panel one for each
    # replica: a query that only returned NaN or a single point would leave a panel blank.
    drawn = {data.panel.title: sorted(s.name for s in data.series if s.points >= 2) for data in pictured}
    assert all(drawn.values()), drawn
    per_pod = [data for data in pictured if data.panel.row == "Per pod"]
    assert per_pod, "no Per pod row in the dashboard"
    for data in per_pod:
        assert sorted(s.labels.get("pod", "") for s in data.series if s.points >= 2) == pods, drawn
