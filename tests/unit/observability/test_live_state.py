"""The figures read at scrape time: the models by state with their memory and budget, and the client
connections, each read from its owner when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from maskserve.config.settings import Settings
from maskserve.observability.live_state import MODEL_STATES, ConnectionState, ModelsState, ServingState
from maskserve.serving.connection_guard import CLOSE_REASONS, ConnectionGuard

# (sample name, sorted label pairs) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(registry: CollectorRegistry) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


def test_the_models_are_counted_by_every_state_with_each_ones_memory_and_the_budget() -> None:
    registry = CollectorRegistry()
    state = ServingState()
    registry.register(state)
    held = ModelsState({"en": "READY", "fr": "LOADING", "de": "READY"}, {"en": 1000, "de": 2000}, 5000)
    state.models = lambda: held
    samples = scrape(registry)
    by_state = {dict(labels)["state"]: value for (name, labels), value in samples.items() if name == "maskserve_models"}
    assert by_state == {"READY": 2, "LOADING": 1, "UNLOADING": 0, "UNAVAILABLE": 0}
    assert set(by_state) == set(MODEL_STATES)  # every state exported, at 0 when empty
    assert samples[("maskserve_model_memory_bytes", (("model", "de"),))] == 2000
    assert samples[("maskserve_model_memory_bytes", (("model", "en"),))] == 1000
    assert samples[("maskserve_models_memory_budget_bytes", ())] == 5000
    # Read afresh at each scrape: a model's unload shows at the next one.
    held = ModelsState({"en": "READY"}, {"en": 1000}, None)
    samples = scrape(registry)
    assert ("maskserve_model_memory_bytes", (("model", "de"),)) not in samples
    assert not any(name == "maskserve_models_memory_budget_bytes" for name, _ in samples)  # no budget


def test_before_any_model_is_loaded_no_queue_or_readiness_figure_is_exported() -> None:
    registry = CollectorRegistry()
    state = ServingState()
    state.ready = lambda: True
    registry.register(state)
    assert scrape(registry) == {}


def test_the_connections_open_unsent_and_closed_by_every_reason_are_read_from_the_guard() -> None:
    guard = ConnectionGuard(Settings())
    registry = CollectorRegistry()
    registry.register(ConnectionState(guard))
    samples = scrape(registry)
    assert samples[("maskserve_open_connections", ())] == 0
    assert samples[("maskserve_unsent_bytes", ())] == 0
    closed = {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "maskserve_closed_connections_total"
    }
    assert closed == dict.fromkeys(CLOSE_REASONS, 0)
    guard.closed["idle"] += 2
    assert scrape(registry)[("maskserve_closed_connections_total", (("reason", "idle"),))] == 2
