"""A rolling restart under load, behind the example's HAProxy with connection-level retries only.

Each replica in turn gets SIGTERM, drains (``/readyz`` 503 for --drain-delay while it still
answers), exits 0, is started again and rejoins. No layer-7 retry hides anything here: every one
of the clients' requests must get its right answer, and only the drain delay makes that true.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

import pytest

from benchmarks.haproxy import HAProxy, check_values, seconds
from tests.system.fleet.fleet import (
    DRAIN_DELAY_S,
    Replica,
    Rotation,
    Workload,
    in_rotation,
    load_figures,
    out_of_rotation,
    record,
    steady_load,
)

# serial: the fleet measures recovery and weights in time, and its balancer and Prometheus are one each.
pytestmark = [pytest.mark.fleet, pytest.mark.serial]


async def test_a_rolling_restart_under_load_fails_no_request(
    balancer: Callable[..., HAProxy], whole_fleet: list[Replica], workload: Workload
) -> None:
    haproxy = balancer(l7_retries=False)
    assert "\n    # retry-on " in haproxy.config  # the example as written: no layer-7 retries
    inter = seconds(check_values(haproxy.config)["inter"])
    restarts = []
    with Rotation(haproxy) as rotation:
        async with steady_load(haproxy.url, workload) as load:
            for replica in whole_fleet:
                sessions_before = rotation.latest[replica.name].sessions
                signalled = time.monotonic()
                replica.send(signal.SIGTERM)
                left, _ = await rotation.wait_for(replica.name, out_of_rotation, since=signalled, timeout_s=30)
                sessions_while_draining = rotation.latest[replica.name].sessions - sessions_before
                exit_code = await asyncio.to_thread(replica.wait_exit, 60)
                exited = time.monotonic()
                output = replica.output()
                assert exit_code == 0, output[-3000:]
                assert "Traceback" not in output, output[-3000:]
                # It left the rotation while it still answered, before its listener closed.
                assert left - signalled < DRAIN_DELAY_S, (left - signalled, rotation.changes)

                replica.start()
                await asyncio.to_thread(replica.wait_ready)
                ready = time.monotonic()
                back, _ = await rotation.wait_for(replica.name, in_rotation, since=exited, timeout_s=30)
                await rotation.wait_serving(replica.name, timeout_s=30)
                restarts.append(
                    {
                        "replica": replica.name,
                        "left_rotation_s": round(left - signalled, 3),
                        "connections_sent_while_draining": sessions_while_draining,
                        "exited_s": round(exited - signalled, 2),
                        "restarted_ready_s": round(ready - exited, 1),
                        "rejoined_after_ready_s": round(back - ready, 2),
                    }
                )
            await asyncio.sleep(1.0)  # the last one serves under load, too
    result = load.result
    assert result is not None
    record(
        "rolling_restart",
        {
            **load_figures(result),
            "check_interval_s": inter,
            "drain_delay_s": DRAIN_DELAY_S,
            "retried_by_haproxy": sum(s.retries for s in rotation.latest.values()),
            "restarts": restarts,
        },
    )
    assert result.stopped, f"the load ended before the restarts did: {load.report()}"
    assert result.failed == 0 and result.correct == result.sent > 0, load.report()
