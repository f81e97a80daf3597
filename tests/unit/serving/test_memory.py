"""The process's memory: its size, its container's limit read from a fake cgroup tree, budgets as
written, and the idle trimmer driven by a fake counter and a fake trim."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from maskserve.config.values import parse_memory_budget
from maskserve.serving import memory
from maskserve.serving.memory import (
    IdleTrimmer,
    container_memory_limit,
    release_freed_memory,
    rss_bytes,
)

GIB = 2**30
MIB = 2**20
# A short delay keeps the tests quick; every wait below is a bound many times longer, so that a
# busy machine only slows them down.
DELAY_S = 0.2


# -- rss and trimming -----------------------------------------------------------------------------


def test_rss_is_the_resident_size() -> None:
    assert rss_bytes() > 10 * MIB  # an interpreter with pytest loaded holds more than that


def test_rss_falls_back_to_the_peak_without_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_proc(*args: object, **kwargs: object) -> None:
        raise OSError("no /proc here")

    monkeypatch.setattr(memory, "open", no_proc, raising=False)
    assert rss_bytes() > 10 * MIB


def test_release_freed_memory_runs() -> None:
    release_freed_memory()  # glibc's malloc_trim here, nothing elsewhere; never raises


# -- the container's limit ------------------------------------------------------------------------


def cgroup_tree(root: Path, self_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    proc = root / "self-cgroup"
    proc.write_text(self_cgroup)
    return root / "fs", proc


def test_v2_limit_is_read(tmp_path: Path) -> None:
    root, proc = cgroup_tree(tmp_path, "0::/\n", {"fs/memory.max": str(GIB)})
    assert container_memory_limit(root, proc) == GIB


def test_v2_max_is_no_limit(tmp_path: Path) -> None:
    root, proc = cgroup_tree(tmp_path, "0::/\n", {"fs/memory.max": "max"})
    assert container_memory_limit(root, proc) is None


def test_v2_smallest_limit_along_the_path_wins(tmp_path: Path) -> None:
    files = {"fs/memory.max": "max", "fs/pod/memory.max": str(2 * GIB), "fs/pod/app/memory.max": "max"}
    root, proc = cgroup_tree(tmp_path, "0::/pod/app\n", files)
    assert container_memory_limit(root, proc) == 2 * GIB


def test_v2_path_outside_the_mount_reads_the_root(tmp_path: Path) -> None:
    # A container's mount shows only its own cgroup, while /proc names the host's path to it.
    root, proc = cgroup_tree(tmp_path, "0::/docker/abc\n", {"fs/memory.max": str(GIB)})
    assert container_memory_limit(root, proc) == GIB


def test_v1_limit_is_read(tmp_path: Path) -> None:
    files = {
        "fs/memory/memory.limit_in_bytes": "9223372036854771712",
        "fs/memory/api/memory.limit_in_bytes": str(512 * MIB),
    }
    root, proc = cgroup_tree(tmp_path, "4:memory:/api\n1:cpu:/\n", files)
    assert container_memory_limit(root, proc) == 512 * MIB


def test_v1_unlimited_is_no_limit(tmp_path: Path) -> None:
    root, proc = cgroup_tree(tmp_path, "4:memory:/\n", {"fs/memory/memory.limit_in_bytes": "9223372036854771712"})
    assert container_memory_limit(root, proc) is None


def test_no_cgroup_files_is_no_limit(tmp_path: Path) -> None:
    assert container_memory_limit(tmp_path / "absent", tmp_path / "absent-cgroup") is None


# -- budgets --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1500MiB", 1500 * MIB),
        ("2GB", 2 * 10**9),
        ("2G", 2 * GIB),
        ("2Gi", 2 * GIB),
        ("512M", 512 * MIB),
        ("512mb", 512 * 10**6),
        ("1.5GiB", int(1.5 * GIB)),
        (" 2 GiB ", 2 * GIB),
        ("1000000", 1_000_000),
        ("4096B", 4096),
    ],
)
def test_sizes_are_read(text: str, size: int) -> None:
    assert parse_memory_budget(text).resolve(None) == size


def test_a_share_is_taken_of_the_limit() -> None:
    assert parse_memory_budget("60%").resolve(10 * GIB) == int(6 * GIB)
    assert parse_memory_budget("12.5%").resolve(8 * GIB) == GIB


def test_a_share_without_a_limit_says_why() -> None:
    budget = parse_memory_budget("60%")
    with pytest.raises(ValueError, match=r"'60%'.*has none"):
        budget.resolve(None)


@pytest.mark.parametrize("text", ["", "abc", "12XB", "-1G", "0", "0.1", "0%", "150%", "1.5.2G", "G", "2 G B", "inf"])
def test_bad_budgets_name_the_text(text: str) -> None:
    with pytest.raises(ValueError, match=f"memory budget {text!r}"):
        parse_memory_budget(text)


# -- the idle trimmer -----------------------------------------------------------------------------


class Trims:
    """A fake trim: counts its calls and the threads they ran on; fails when told to."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.fail = False

    def __call__(self) -> None:
        self.threads.append(threading.get_ident())
        if self.fail:
            raise RuntimeError("trim failed")


@pytest.fixture
def trims() -> Trims:
    return Trims()


async def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


class Running:
    """An IdleTrimmer's task over a settable counter, cancelled at the end."""

    def __init__(self, trims: Trims, activity: Callable[[], int] | None = None) -> None:
        self.count = 0
        self.trimmer = IdleTrimmer(activity or (lambda: self.count), delay_s=DELAY_S, trim=trims)
        self.task = asyncio.create_task(self.trimmer.run())


@pytest.fixture
async def running(trims: Trims) -> AsyncIterator[Running]:
    run = Running(trims)
    await asyncio.sleep(0)  # the trimmer reads its starting value
    yield run
    run.task.cancel()


async def test_a_quiet_spell_after_traffic_trims_once_off_the_loop(running: Running, trims: Trims) -> None:
    running.count += 3
    await until(lambda: len(trims.threads) == 1)
    await asyncio.sleep(5 * DELAY_S)
    assert len(trims.threads) == 1 and running.trimmer.trims == 1
    assert trims.threads[0] != threading.get_ident()


async def test_each_quiet_spell_after_new_traffic_trims_again(running: Running, trims: Trims) -> None:
    running.count += 1
    await until(lambda: len(trims.threads) == 1)
    running.count += 1
    await until(lambda: len(trims.threads) == 2)


async def test_nothing_since_the_start_never_trims(running: Running, trims: Trims) -> None:
    await asyncio.sleep(5 * DELAY_S)
    assert trims.threads == []


async def test_traffic_that_keeps_flowing_never_trims(trims: Trims) -> None:
    reads = iter(range(1_000_000))  # the counter moves between every two looks
    run = Running(trims, activity=lambda: next(reads))
    await asyncio.sleep(5 * DELAY_S)
    run.task.cancel()
    assert trims.threads == []


async def test_a_failing_trim_is_logged_and_the_trimmer_goes_on(
    running: Running, trims: Trims, caplog: pytest.LogCaptureFixture
) -> None:
    trims.fail = True
    running.count += 1
    await until(lambda: len(trims.threads) == 1)
    await until(lambda: "handing freed memory back failed" in caplog.text)
    trims.fail = False
    running.count += 1
    await until(lambda: len(trims.threads) == 2)


async def test_cancelling_ends_the_trimmer(running: Running) -> None:
    running.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running.task


def test_the_models_budget_is_resolved_at_start_against_the_containers_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from maskserve.config.flags import load_settings
    from maskserve.config.settings import SettingsError
    from maskserve.http.app import SETTINGS_CHECKS

    monkeypatch.setattr(memory, "container_memory_limit", lambda: 4 * GIB)
    settings = load_settings(["--models-memory", "60%"], env={}, checks=SETTINGS_CHECKS)
    assert memory.models_memory_budget(settings) == int(4 * GIB * 0.6)
    assert memory.models_memory_budget(load_settings([], env={})) is None
    monkeypatch.setattr(memory, "container_memory_limit", lambda: None)
    with pytest.raises(SettingsError, match=r"--models-memory: .* has none"):
        load_settings(["--models-memory", "60%"], env={}, checks=SETTINGS_CHECKS)
