"""service/model_budget.py: what counts against the budget, which models a load evicts, and when
a load is refused or paced instead."""

from __future__ import annotations

import pytest

from maskserve.errors import LoadsPaced, ModelsMemoryExceeded
from maskserve.service.model_budget import MIB, Candidate, ModelBudget, ModelsDoNotFit


def candidate(name: str, size_mib: int, last_used: float, *, loaded_at: float = 0.0, idle: bool = True) -> Candidate:
    return Candidate(name, size_mib * MIB, last_used, loaded_at, idle)


def test_memory_on_its_way_back_counts_until_released() -> None:
    budget = ModelBudget(300 * MIB)
    budget.charged["a"] = 100 * MIB
    ticket = budget.releasing_from(budget.charged.pop("a"))
    assert budget.held() == 100 * MIB and not budget.fits(250 * MIB)
    budget.released(ticket)
    assert budget.held() == 0 and budget.fits(250 * MIB)


def test_a_load_that_fits_evicts_nothing_and_no_budget_never_evicts() -> None:
    assert ModelBudget(300 * MIB).victims("b", 100 * MIB, [candidate("a", 100, 1.0)], now=10, min_residency=None) == []
    unlimited = ModelBudget(None)
    unlimited.charged["a"] = 10**12
    assert unlimited.victims("b", 10**12, [], now=0, min_residency=None) == []


def test_the_least_recently_used_idle_models_are_evicted_first_and_no_more_than_needed() -> None:
    budget = ModelBudget(300 * MIB)
    budget.charged |= {"a": 100 * MIB, "b": 100 * MIB, "c": 100 * MIB}
    models = [candidate("a", 100, 3.0), candidate("b", 100, 1.0), candidate("c", 100, 2.0, idle=False)]
    chosen = budget.victims("d", 150 * MIB, models, now=10, min_residency=None)
    assert [c.name for c in chosen] == ["b", "a"]
    assert [c.name for c in budget.victims("d", 50 * MIB, models, now=10, min_residency=None)] == ["b"]


def test_a_load_that_even_every_idle_model_would_not_make_room_for_is_refused() -> None:
    budget = ModelBudget(300 * MIB)
    budget.charged |= {"a": 100 * MIB, "busy": 200 * MIB}
    models = [candidate("a", 100, 1.0), candidate("busy", 200, 0.0, idle=False)]
    with pytest.raises(ModelsMemoryExceeded, match="only 100 MiB of them are idle; nothing was unloaded"):
        budget.victims("d", 150 * MIB, models, now=10, min_residency=None)


def test_a_reservation_in_progress_counts_against_the_next_load() -> None:
    budget = ModelBudget(300 * MIB)
    budget.reserved["loading"] = 250 * MIB
    with pytest.raises(ModelsMemoryExceeded):
        budget.victims("d", 100 * MIB, [], now=0, min_residency=None)


def test_an_on_demand_load_spares_young_models_and_is_paced_when_only_they_stand_in_the_way() -> None:
    budget = ModelBudget(200 * MIB)
    budget.charged |= {"old": 100 * MIB, "young": 100 * MIB}
    models = [candidate("young", 100, 1.0, loaded_at=95.0), candidate("old", 100, 2.0, loaded_at=0.0)]
    # The young one is the least recently used, but too new to go: the old one goes instead.
    assert [c.name for c in budget.victims("d", 100 * MIB, models, now=100.0, min_residency=30.0)] == ["old"]
    with pytest.raises(LoadsPaced) as paced:
        budget.victims("d", 200 * MIB, models, now=100.0, min_residency=30.0)
    assert paced.value.retry_after == pytest.approx(25.0) and paced.value.status == 503
    # Without pacing (an explicit load), both may go.
    assert len(budget.victims("d", 200 * MIB, models, now=100.0, min_residency=None)) == 2


def test_a_measure_past_the_budget_shows_as_over() -> None:
    budget = ModelBudget(200 * MIB)
    budget.charged["a"] = 150 * MIB
    budget.reserved["b"] = 100 * MIB
    assert budget.over_by() == 50 * MIB
    assert ModelBudget(None).over_by() == 0


def test_start_up_models_that_do_not_fit_are_named_as_a_settings_error() -> None:
    error = ModelsDoNotFit.of({"a": 300 * MIB, "b": 200 * MIB}, 400 * MIB)
    assert "'a' 300 MiB, 'b' 200 MiB" in str(error) and "400 MiB budget" in str(error)
    assert isinstance(error, ValueError)  # a SettingsError: the server exits 2
