"""The CPUs this process may really use: its affinity mask, then its cgroup's quota."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """The CPUs this process may really use: affinity mask, then the cgroup v2/v1 quota.

    torch defaults to the *node's* core count, which oversubscribes a container limited to fewer
    cores: its threads then wait for CPU time the quota never grants, and every pass is throttled.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, max(1, int(quota)))
    return max(1, cpus)


def _cgroup_cpu_quota() -> float | None:
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as f:
            period_us = int(f.read())
        if quota_us > 0:
            return quota_us / period_us
    except (OSError, ValueError):
        pass
    return None
