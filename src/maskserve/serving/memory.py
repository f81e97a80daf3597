"""The process's memory: how much it holds, how much its container may hold, a budget written as
a size or a share of that limit, and handing freed memory back to the system once traffic stops.
Plain Python and asyncio: no HTTP, no torch.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from maskserve.config.settings import Settings
from maskserve.config.values import parse_memory_budget

T = TypeVar("T")

log = logging.getLogger("maskserve.memory")

# Seconds the activity counter must stay still before freed memory is handed back. A trim walks
# every heap of the allocator, and the next burst faults the returned pages back in: trimming
# between the batches of a steady stream of requests would pay both for nothing. A pause longer
# than a client's think time means the traffic has stopped; much longer would leave the memory
# held through the quiet spells that an orchestrator watches.
IDLE_TRIM_DELAY_S = 10.0
# The most seconds between two looks at the counter: reading an int is free, and a trim comes at
# most this late after the delay has run out.
IDLE_POLL_S = 2.5

# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit count; nothing real comes
# near 2^62 bytes, so anything from there up is read as no limit.
_NO_LIMIT = 2**62


def rss_bytes() -> int:
    """This process's resident memory now, in bytes. Off Linux, its peak (the closest that the
    standard library knows), or 0 where even that is unknown."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # not on Windows
    except ImportError:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # macOS counts ru_maxrss in bytes, the other Unixes in KiB.
    return peak if os.uname().sysname == "Darwin" else peak * 1024


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None
    return trim


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system. Memory that Python and torch have freed goes
    back to the allocator, which keeps it for the process: without this, the resident memory stays
    at the peak that the largest answers pushed it to. A no-op off glibc, and under an allocator
    preloaded in glibc's place (jemalloc), whose own decay returns its pages."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# -- the container's limit ------------------------------------------------------------------------


def container_memory_limit(
    cgroup_root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """The memory limit of this process's cgroup in bytes (v2 ``memory.max``, else v1
    ``memory.limit_in_bytes``), the smallest along its path; None when unlimited or unknown."""
    try:
        lines = self_cgroup.read_text(encoding="ascii").splitlines()
    except OSError:
        lines = []
    paths = {}  # controller ("" for v2's unified hierarchy) -> the process's cgroup path
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        for controller in controllers.split(","):
            paths[controller] = path
    v2 = _smallest_limit(cgroup_root, paths.get("", "/"), "memory.max")
    if v2 is not None:
        return v2
    return _smallest_limit(cgroup_root / "memory", paths.get("memory", "/"), "memory.limit_in_bytes")


def _smallest_limit(mount: Path, path: str, name: str) -> int | None:
    """The smallest limit in ``name`` from the cgroup at ``path`` up to the mount's root. Inside a
    container the mount often shows only the container's own cgroup, so a path that is not
    there falls back to the root, which is then that cgroup."""
    limits = []
    folder = mount.joinpath(*[part for part in path.split("/") if part])
    while True:
        limit = _read_limit(folder / name)
        if limit is not None:
            limits.append(limit)
        if folder == mount or mount not in folder.parents:
            break
        folder = folder.parent
    return min(limits, default=None)


def _read_limit(file: Path) -> int | None:
    try:
        text = file.read_text(encoding="ascii").strip()
    except OSError:
        return None
    if not text.isdigit():  # v2's "max": no limit
        return None
    value = int(text)
    return value if 0 < value < _NO_LIMIT else None


# -- a memory budget ------------------------------------------------------------------------------


def models_memory_budget(settings: Settings) -> int | None:
    """``--models-memory`` in bytes (a share taken of the container's limit); None without one."""
    if settings.models_memory is None:
        return None
    return parse_memory_budget(settings.models_memory).resolve(container_memory_limit())


def resident_growth(call: Callable[[], T]) -> tuple[T, int]:
    """``call()``'s result, and how many resident bytes the process grew by while it ran (never
    below 0): a model load's size, when nothing else allocates much meanwhile."""
    before = rss_bytes()
    result = call()
    return result, max(0, rss_bytes() - before)


# -- handing memory back once traffic stops -------------------------------------------------------


class IdleTrimmer:
    """Hands freed memory back once ``activity()`` (a counter, such as forward passes run) has stayed
    still for ``delay_s``: once per quiet spell, never while it moves, never twice for the same
    value. The owner runs :meth:`run` as a task and cancels it at shutdown."""

    def __init__(
        self,
        activity: Callable[[], int],
        *,
        delay_s: float = IDLE_TRIM_DELAY_S,
        trim: Callable[[], None] = release_freed_memory,
        poll_s: float = IDLE_POLL_S,
    ) -> None:
        self.activity = activity
        self.delay_s = delay_s
        self.trim = trim
        # Look at least four times a delay, so a short delay (in tests) is not overshot by much.
        self.poll_s = min(poll_s, delay_s / 4)
        self.trims = 0

    async def run(self) -> None:
        """Watch the counter until cancelled. What ran before the start counts as already handed
        back: the owner trims after a load's warm-up, or after an unload, itself."""
        loop = asyncio.get_running_loop()
        seen = trimmed = self.activity()
        moved_at = time.monotonic()
        while True:
            await asyncio.sleep(self.poll_s)
            now = self.activity()
            if now != seen:
                seen, moved_at = now, time.monotonic()
            elif now != trimmed and time.monotonic() - moved_at >= self.delay_s:
                # Marked first: work that arrives during the trim moves the counter past it, and
                # its own quiet spell trims again.
                trimmed = now
                await loop.run_in_executor(None, self._trim_and_log)
                self.trims += 1

    def _trim_and_log(self) -> None:
        """The trim, off the event loop: a large heap takes a while to walk."""
        before = rss_bytes()
        try:
            self.trim()
        except Exception:  # the server keeps serving; memory stays held until the next spell
            log.exception("handing freed memory back failed")
            return
        log.debug("idle: handed %.0f MiB back to the system", (before - rss_bytes()) / 2**20)
