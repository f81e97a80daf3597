"""service/lifecycle.py: serving until a stop signal, then draining since that moment, once."""

from __future__ import annotations

import time

from maskserve.service.lifecycle import Lifecycle


def test_a_new_server_is_serving() -> None:
    lifecycle = Lifecycle()
    assert not lifecycle.draining and lifecycle.draining_since is None


def test_draining_starts_now_on_the_monotonic_clock() -> None:
    lifecycle = Lifecycle()
    before = time.monotonic()
    assert lifecycle.start_draining() is True
    assert lifecycle.draining
    assert lifecycle.draining_since is not None and before <= lifecycle.draining_since <= time.monotonic()


def test_a_second_signal_keeps_the_first_moment() -> None:
    lifecycle = Lifecycle()
    lifecycle.start_draining()
    since = lifecycle.draining_since
    assert lifecycle.start_draining() is False
    assert lifecycle.draining and lifecycle.draining_since == since
