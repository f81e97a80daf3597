"""The fleet tests run deploy/haproxy.cfg itself: rendering changes only addresses, the L7 line and a stats socket."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from benchmarks.haproxy import L7_RETRIES, TEMPLATE, Address, documented_replica_flags, render_config
from tests.system.deploy.test_haproxy import haproxy_check

pytestmark = pytest.mark.deploy

REPLICAS = [Address(f"replica{i}", f"127.0.0.1{i}", 20000 + i, 21000 + i) for i in (1, 2, 3)]


def render(tmp_path: Path, *, l7_retries: bool, template: Path = TEMPLATE) -> str:
    return render_config(
        bind=("127.0.0.10", 20000),
        servers=REPLICAS,
        stats_socket=tmp_path / "haproxy.sock",
        l7_retries=l7_retries,
        template=template,
    )


def changed_lines(rendered: str) -> tuple[list[str], list[str]]:
    """(lines of the example that rendering removed, lines it added), stripped."""
    diff = list(difflib.ndiff(TEMPLATE.read_text(encoding="utf-8").splitlines(), rendered.splitlines()))
    return [d[2:].strip() for d in diff if d.startswith("- ")], [d[2:].strip() for d in diff if d.startswith("+ ")]


def test_rendering_changes_only_the_addresses_and_adds_a_read_only_stats_socket(tmp_path: Path) -> None:
    removed, added = changed_lines(render(tmp_path, l7_retries=True))  # as the example ships
    assert removed == ["bind :8000", *[f"server replica{i} 127.0.0.1:800{i} agent-port 900{i}" for i in (1, 2, 3)]]
    assert added == [
        f"stats socket {tmp_path / 'haproxy.sock'} mode 600 level user",
        "bind 127.0.0.10:20000",
        *[f"server replica{i} 127.0.0.1{i}:2000{i} agent-port 2100{i}" for i in (1, 2, 3)],
    ]


def test_l7_retries_off_turns_off_exactly_the_documented_line(tmp_path: Path) -> None:
    removed, added = changed_lines(render(tmp_path, l7_retries=False))
    assert L7_RETRIES in removed and f"# {L7_RETRIES}" in added
    assert len(removed) == 5 and len(added) == 6


@pytest.mark.parametrize("l7_retries", [False, True])
def test_haproxy_accepts_what_the_fleet_tests_run(tmp_path: Path, l7_retries: bool) -> None:
    path = tmp_path / "haproxy.cfg"
    path.write_text(render(tmp_path, l7_retries=l7_retries), encoding="utf-8")
    result = haproxy_check(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_example_starts_replicas_with_the_proven_drain_delay_and_a_share_of_the_cores() -> None:
    flags = documented_replica_flags()
    assert "--agent-port" not in flags  # each replica gets its own
    assert flags[flags.index("--drain-delay") + 1] == "2"  # the drain the rolling restart proves
    assert flags[flags.index("--torch-threads") + 1] == "1"  # three replicas share the cores


def test_an_example_that_drifted_from_the_rendering_is_refused(tmp_path: Path) -> None:
    drifted = tmp_path / "drifted.cfg"
    drifted.write_text(TEMPLATE.read_text(encoding="utf-8").replace(L7_RETRIES, "# retries off"), encoding="utf-8")
    with pytest.raises(ValueError, match="no longer has the shape"):
        render(tmp_path, l7_retries=True, template=drifted)
