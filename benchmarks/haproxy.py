"""HAProxy in front of maskserve replicas, configured from deploy/haproxy.cfg itself.

The fleet tests (tests/system/fleet/) and the fleet benchmark (benchmarks/fleet.py) run the example users
start from, not a copy: :func:`render_config` takes ``deploy/haproxy.cfg`` and changes only where
it listens, which replicas it knows, whether its documented layer-7 retry line is on, and adds a
stats socket to read the servers' state from; :func:`documented_replica_flags` gives the flags its
comment starts the replicas with. Every change must find its line, so an example that drifts from
what is rendered here fails loudly instead of being silently tested in another shape.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent / "deploy" / "haproxy.cfg"
BACKEND = "maskserve"
# The layer-7 retry line the example documents; render_config turns it on or off.
L7_RETRIES = "retry-on conn-failure empty-response 503"


@dataclass(frozen=True)
class Address:
    """A replica as HAProxy names it, and where it listens."""

    name: str
    host: str
    port: int
    # Where its HAProxy agent (--agent-port) answers; None: it runs none.
    agent_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"


@dataclass(frozen=True)
class ServerState:
    """One server line of HAProxy's ``show stat``."""

    status: str  # UP, DOWN, "UP 1/2" (going down), "DOWN 1/2" (going up), MAINT, ...
    sessions: int  # stot: connections HAProxy has sent it so far
    check: str  # the last check's outcome, e.g. L7OK, L7STS (a 503), L4CON (refused)
    retries: int = 0  # wretr: requests sent to it that HAProxy tried again (connection or L7 retries)
    redispatches: int = 0  # wredis: of those, moved to another server
    weight: int = 0  # its effective weight now: the configured one times the agent's percentage

    @property
    def in_rotation(self) -> bool:
        """HAProxy may send it new requests (it stays UP while a failed check is counted toward fall)."""
        return self.status.startswith("UP")


def haproxy_binary() -> str:
    # Debian's haproxy lands in /usr/sbin, not always on a user's PATH (.ci/ensure-haproxy installs it).
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    if found is None:
        raise RuntimeError("haproxy is not installed: run .ci/ensure-haproxy (Debian package haproxy)")
    return found


def haproxy_version() -> str:
    """The first line of ``haproxy -v`` (``HAProxy version 2.6.12-1+deb12u4 ...``)."""
    out = subprocess.run([haproxy_binary(), "-v"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else "haproxy (unknown version)"


def render_config(
    *,
    bind: tuple[str, int],
    servers: Sequence[Address],
    stats_socket: Path,
    l7_retries: bool,
    template: Path = TEMPLATE,
) -> str:
    """The example, listening on ``bind``, balancing ``servers``, with its L7 retry line on or off."""
    lines = template.read_text(encoding="utf-8").splitlines()
    out: list[str] = []
    binds = retry_lines = server_lines = 0
    for line in lines:
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if stripped == "global":
            out.append(line)
            # Test-only addition: a socket to read the servers' state from; it changes no behaviour.
            out.append(f"{indent}    stats socket {stats_socket} mode 600 level user")
            continue
        if stripped.startswith("bind "):
            binds += 1
            out.append(f"{indent}bind {bind[0]}:{bind[1]}")
            continue
        if re.fullmatch(r"#?\s*" + re.escape(L7_RETRIES), stripped):
            retry_lines += 1
            out.append(f"{indent}{'' if l7_retries else '# '}{L7_RETRIES}")
            continue
        match = re.fullmatch(r"server \S+ \S+(.*)", stripped)
        if match:
            server_lines += 1
            if server_lines == 1:  # the example's servers become ours, with the example's options
                options = re.sub(r" agent-port \d+", "", match.group(1))
                out += [
                    f"{indent}server {s.name} {s.host}:{s.port}"
                    + (f" agent-port {s.agent_port}" if s.agent_port is not None else "")
                    + options
                    for s in servers
                ]
            continue
        out.append(line)
    if (binds, retry_lines) != (1, 1) or server_lines == 0:
        raise ValueError(
            f"{template} no longer has the shape this rendering expects: {binds} bind lines, "
            f"{retry_lines} '{L7_RETRIES}' lines (commented or not), {server_lines} server lines"
        )
    return "\n".join(out) + "\n"


def documented_replica_flags(template: Path = TEMPLATE) -> list[str]:
    """The flags the example starts each replica with (``maskserve --port $port FLAGS &``), the port
    and the agent's port aside (each replica gets its own)."""
    match = re.search(r"maskserve --port \$port((?: --[\w-]+ [^\s&]+)*) &", template.read_text(encoding="utf-8"))
    if match is None:
        raise ValueError(f"{template} no longer shows how to start its replicas (maskserve --port $port ... &)")
    flags = match.group(1).split()
    if "--agent-port" not in flags:
        raise ValueError(f"{template} no longer starts its replicas with --agent-port, which its servers read")
    at = flags.index("--agent-port")
    return flags[:at] + flags[at + 2 :]


def check_values(config: str) -> dict[str, str]:
    """The ``default-server`` words of a rendered config that take a value (inter, fall, rise)."""
    (line,) = [s.strip() for s in config.splitlines() if s.strip().startswith("default-server ")]
    words = line.split()[1:]
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w in {"inter", "fall", "rise"}}


def seconds(duration: str) -> float:
    """An HAProxy time (``300ms``, ``1s``; milliseconds when no unit) in seconds."""
    number, unit = re.fullmatch(r"(\d+)(us|ms|s|m)?", duration).groups()  # type: ignore[union-attr]
    return int(number) * {"us": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0, None: 0.001}[unit]


class HAProxy:
    """One HAProxy in the foreground (``-db``), its own process group, its log in ``folder``."""

    def __init__(self, folder: Path, *, bind: tuple[str, int], servers: Sequence[Address], l7_retries: bool) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.stats_socket = folder / "haproxy.sock"
        if len(str(self.stats_socket)) > 100:  # sun_path holds 108 bytes
            raise ValueError(f"the stats socket path is too long for a unix socket: {self.stats_socket}")
        self.config = render_config(bind=bind, servers=servers, stats_socket=self.stats_socket, l7_retries=l7_retries)
        self.config_path = folder / "haproxy.cfg"
        self.config_path.write_text(self.config, encoding="utf-8")
        self.log_path = folder / "haproxy.log"
        self.url = f"http://{bind[0]}:{bind[1]}/"
        self.servers = list(servers)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        """Start it and wait until every server is in rotation (checks passed ``rise`` times)."""
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [haproxy_binary(), "-db", "-f", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() kills all of it
            )
        self.wait_until(lambda states: all(s.in_rotation for s in states.values()), timeout_s, "every server UP")

    def wait_until(
        self, condition: Callable[[dict[str, ServerState]], bool], timeout_s: float, what: str
    ) -> dict[str, ServerState]:
        """Poll ``show stat`` until ``condition(states)`` holds; the states that satisfied it."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, ServerState] = {}
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.process.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError):
                states = self.states()
                if states and condition(states):
                    return states
            time.sleep(0.05)
        raise TimeoutError(f"haproxy: not {what} within {timeout_s:.0f}s; last states {states}")

    def states(self) -> dict[str, ServerState]:
        """Each server's state, read from the stats socket (raises OSError before it listens)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(b"show stat\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        text = b"".join(chunks).decode("utf-8", "replace").lstrip("# ")
        rows = csv.DictReader(line for line in text.splitlines() if line)
        return {
            row["svname"]: ServerState(
                row["status"],
                int(row["stot"] or 0),
                row["check_status"],
                int(row["wretr"] or 0),
                int(row["wredis"] or 0),
                int(row["weight"] or 0),
            )
            for row in rows
            if row["pxname"] == BACKEND and row["svname"] not in {"FRONTEND", "BACKEND"}
        }

    def cpu_seconds(self) -> float:
        """User + system CPU time HAProxy has used so far (from /proc)."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)  # HAProxy's hard stop
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> HAProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
