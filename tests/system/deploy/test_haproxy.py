"""deploy/haproxy.cfg: valid for HAProxy, and sized to maskserve's own deadlines and probes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from maskserve.config.settings import Settings
from maskserve.errors import ServiceUnavailable
from tests.paths import ROOT

pytestmark = pytest.mark.deploy

CONFIG = ROOT / "deploy" / "haproxy.cfg"
L7_RETRIES = "retry-on conn-failure empty-response 503"


def haproxy_check(path: Path) -> subprocess.CompletedProcess[str]:
    # .ci/ensure-haproxy installs Debian's haproxy, in /usr/sbin (not always on a user's PATH).
    haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    assert haproxy, "tox -e deploy installs haproxy first (.ci/ensure-haproxy)"
    return subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True, timeout=60, check=False)


def directives(section: str) -> list[str]:
    """The non-comment lines of one section (``defaults``, ``backend maskserve``...)."""
    lines: list[str] = []
    inside = False
    for raw in CONFIG.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if raw and not raw[0].isspace():
            inside = line == section
            continue
        if inside and line and not line.startswith("#"):
            lines.append(" ".join(line.split()))
    return lines


def seconds(duration: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(ms|s|m)?", duration).groups()  # type: ignore[union-attr]
    return int(number) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 0.001}[unit]


def timeouts() -> dict[str, float]:
    found = {}
    for line in directives("defaults") + directives("backend maskserve"):
        if line.startswith("timeout "):
            _, name, duration = line.split()
            found[name] = seconds(duration)
    return found


def test_haproxy_accepts_the_config() -> None:
    result = haproxy_check(CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_recommended_l7_retries_are_on_and_the_example_is_valid_without_them(tmp_path: Path) -> None:
    text = CONFIG.read_text(encoding="utf-8")
    assert f"\n    {L7_RETRIES}\n" in text  # on, not commented out
    disabled = tmp_path / "haproxy.cfg"
    disabled.write_text(text.replace(L7_RETRIES, f"# {L7_RETRIES}"), encoding="utf-8")
    result = haproxy_check(disabled)
    assert result.returncode == 0, result.stdout + result.stderr


def test_replicas_are_checked_on_readyz_and_balanced_by_least_connections() -> None:
    backend = directives("backend maskserve")
    assert "balance leastconn" in backend
    assert "option httpchk GET /readyz" in backend
    assert "http-check expect status 200" in backend
    (server_defaults,) = [line for line in backend if line.startswith("default-server ")]
    words = server_defaults.split()
    assert "check" in words
    assert words[words.index("fall") + 1] == "1"
    assert int(words[words.index("rise") + 1]) >= 2
    assert seconds(words[words.index("inter") + 1]) <= 1
    assert len([line for line in backend if line.startswith("server ")]) == 3


def test_load_is_a_weight_from_each_replicas_agent_and_never_a_check() -> None:
    backend = directives("backend maskserve")
    (server_defaults,) = [line for line in backend if line.startswith("default-server ")]
    words = server_defaults.split()
    assert "agent-check" in words and seconds(words[words.index("agent-inter") + 1]) <= 1
    # Room for the agent's percentages: 1% of 100 is still a weight of 1, never 0.
    assert int(words[words.index("weight") + 1]) >= 100
    servers = [line for line in backend if line.startswith("server ")]
    agent_ports = [line.split()[line.split().index("agent-port") + 1] for line in servers]
    assert len(set(agent_ports)) == len(servers) == 3
    # Each replica is started with its own agent port, the one its server line reads.
    started = re.search(r"--agent-port \$\(\(port\+(\d+)\)\)", CONFIG.read_text(encoding="utf-8"))
    assert started is not None
    ports = [int(line.split()[2].rsplit(":", 1)[1]) for line in servers]
    assert [str(port + int(started.group(1))) for port in ports] == agent_ports


def test_l7_retries_never_carry_a_request_that_may_have_run_to_another_replica() -> None:
    # A timed-out request may be what holds its replica: retrying it spreads the harm (a query of
    # death). Only requests that surely did not run, or whose replica died, are tried again.
    retry = next(line for line in directives("backend maskserve") if line.startswith("retry-on "))
    assert set(retry.split()[1:]) == {"conn-failure", "empty-response", "503"}


def test_failed_connections_are_retried_on_another_replica() -> None:
    defaults = directives("defaults")
    assert "retries 3" in defaults
    assert any(line.startswith("option redispatch") for line in defaults)


def test_haproxy_waits_for_maskserve_to_answer_its_own_deadline() -> None:
    # maskserve answers 504 itself at --request-timeout: HAProxy must not cut it short, or the
    # client gets HAProxy's 504 (without maskserve's body and request id) a moment earlier.
    found = timeouts()
    assert found["server"] > Settings().request_timeout
    assert found["client"] >= found["server"]
    # A check gets a short budget: /readyz answers from memory in milliseconds.
    assert found["check"] <= 2


def test_haproxy_cuts_slow_clients_before_the_replicas_would() -> None:
    # In front, HAProxy's own bounds on a client come first; the replicas' are the backstop.
    found, settings = timeouts(), Settings()
    assert found["http-request"] < settings.header_timeout
    assert found["http-keep-alive"] < settings.keepalive_timeout
    # A client that reads its answer slowly is cut by HAProxy's client timeout; the replica's write
    # to HAProxy (which reads at once) never gets near its own write timeout.
    assert found["client"] < settings.write_timeout


def test_haproxy_s_own_503_has_maskserve_s_error_shape() -> None:
    # When every replica is out, clients must not be able to tell HAProxy's 503 from a replica's.
    (line,) = [line for line in directives("backend maskserve") if line.startswith("http-error status 503 ")]
    body = re.search(r"lf-string '([^']*)'", line).group(1)  # type: ignore[union-attr]
    headers = dict(re.findall(r"hdr (\S+) (\S+)", line))
    request_id = "0f8c2d3e-1a2b-4c5d-8e9f-0a1b2c3d4e5f"
    sent = json.loads(body.replace("%[unique-id]", request_id))
    error = ServiceUnavailable(sent["error"], retry_after=1)
    assert sent == {"error": error.message, "error_type": error.kind, "request_id": request_id, **error.details()}
    assert headers == {**error.headers(), "X-Request-Id": "%[unique-id]"}


def test_the_documented_replicas_drain_longer_than_the_checks_take_to_notice() -> None:
    # A replica being stopped must leave HAProxy's rotation before it closes its port.
    (delay,) = set(re.findall(r"--drain-delay (\d+(?:\.\d+)?)", CONFIG.read_text(encoding="utf-8")))
    words = next(line for line in directives("backend maskserve") if line.startswith("default-server ")).split()
    noticed = seconds(words[words.index("inter") + 1]) * int(words[words.index("fall") + 1])
    assert float(delay) > noticed
