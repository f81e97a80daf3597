"""What the settings imply: masks a text may hold, a text's predictions, threads and the cache folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from maskserve.config.cpus import available_cpus
from maskserve.config.flags import load_settings
from maskserve.config.settings import Settings


def test_masks_allowed_grow_with_the_models_lengths_in_a_text_unless_set() -> None:
    defaults = load_settings([], env={})
    assert [defaults.masks_allowed(tokens, 512) for tokens in (10, 512, 513, 1500, 4096)] == [8, 8, 16, 24, 64]
    assert defaults.masks_allowed(1500, 128) == 8 * 12
    written = load_settings(["--max-masks-per-text", "8"], env={})
    assert [written.masks_allowed(tokens, 512) for tokens in (10, 1500, 4096)] == [8, 8, 8]
    assert defaults.text_predictions(512) == min(64 * defaults.max_top_k, defaults.max_predictions)


def test_threads_default_to_the_cpus_this_process_may_use_adaptively() -> None:
    assert Settings().resolved_threads() == available_cpus()
    assert Settings().adaptive_threads
    assert not Settings(threads=3).adaptive_threads
    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))
    assert Settings(threads=3).resolved_threads() == 3


def test_cache_dir_defaults_to_xdg_cache_home_then_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/op")
    assert Settings().resolved_cache_dir(env={}) == Path("/home/op/.cache/maskserve")
    assert Settings().resolved_cache_dir(env={"XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/maskserve")
    # The XDG spec ignores a relative path.
    assert Settings().resolved_cache_dir(env={"XDG_CACHE_HOME": "rel"}) == Path("/home/op/.cache/maskserve")
    given = load_settings(["--cache-dir", "/srv/cache"], env={"XDG_CACHE_HOME": "/xdg"})
    assert given.resolved_cache_dir(env={"XDG_CACHE_HOME": "/xdg"}) == Path("/srv/cache")
