"""The CPUs this process may use (config/cpus.py): its affinity mask, then its cgroup's quota."""

from __future__ import annotations

import os

import pytest

from maskserve.config import cpus


def test_the_cpus_are_at_most_the_affinity_mask_and_at_least_one() -> None:
    assert 1 <= cpus.available_cpus() <= len(os.sched_getaffinity(0))


def test_a_cgroup_quota_below_the_affinity_mask_caps_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(cpus, "_cgroup_cpu_quota", lambda: 2.5)
    assert cpus.available_cpus() == 2


def test_a_quota_under_one_cpu_still_leaves_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.setattr(cpus, "_cgroup_cpu_quota", lambda: 0.5)
    assert cpus.available_cpus() == 1


def test_no_quota_leaves_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(3)))
    monkeypatch.setattr(cpus, "_cgroup_cpu_quota", lambda: None)
    assert cpus.available_cpus() == 3
