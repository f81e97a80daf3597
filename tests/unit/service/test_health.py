"""service/health.py: liveness and readiness as plain functions of the scheduler's state, which
every protocol's probes answer from (HTTP's in tests/unit/api/test_health.py, gRPC's in
tests/unit/rpc/test_health.py)."""

from __future__ import annotations

from maskserve.service.health import liveness, readiness


def test_readiness_before_the_model_is_loaded_says_loading() -> None:
    live = liveness(None, None, stall_floor=60.0)
    assert live.ok
    ready = readiness(None, live)
    assert not ready.ok
    assert [p.code for p in ready.problems] == ["loading"]
    assert ready.body()["status"] == "unavailable"
