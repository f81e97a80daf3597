"""One model's own settings: which keys a model may set, and the server's settings with them applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskserve.config.flags import load_settings
from maskserve.config.model_settings import (
    MODEL_SETTINGS_SCHEMA,
    PER_MODEL_SETTINGS,
    SERVER_WIDE,
    read_yaml,
    validated,
    with_overrides,
)
from maskserve.config.settings import NamedSettingsError, Settings


def test_a_model_sets_how_it_runs_and_what_it_admits_never_the_servers_own_settings() -> None:
    assert {"backend", "dtype", "max_batch_size", "max_queue", "max_inputs"} <= set(PER_MODEL_SETTINGS)
    assert not SERVER_WIDE & set(PER_MODEL_SETTINGS)
    assert not {"port", "workers", "api_key", "control_key"} & set(PER_MODEL_SETTINGS)


def test_overrides_are_parsed_by_each_settings_own_parser() -> None:
    own = with_overrides(Settings(), {"max_queue": "64", "warmup": False, "max_batch_delay": 0.01}, "model 'a'")
    assert (own.max_queue, own.warmup, own.max_batch_delay) == (64, False, 0.01)


def test_an_override_with_a_bad_value_is_refused_naming_where_and_the_key() -> None:
    with pytest.raises(NamedSettingsError, match=r"^model 'a': max_queue: invalid value 0 "):
        with_overrides(Settings(), {"max_queue": 0}, "model 'a'")


def test_an_override_that_contradicts_a_written_server_setting_is_refused() -> None:
    server = load_settings(["--max-score-tokens", "64"], env={})
    with pytest.raises(NamedSettingsError, match="max_score_tokens=64 contradicts max_queue=8"):
        with_overrides(server, {"max_queue": 8}, "model 'a'")


def test_the_servers_followed_defaults_move_afresh_to_fit_a_models_own_limits() -> None:
    server = load_settings(["--max-queue", "16"], env={})
    assert server.max_inputs == 16  # followed the server's queue
    assert with_overrides(server, {"max_queue": 512}, "model 'big'").max_inputs == Settings().max_inputs


def test_the_schema_refuses_a_server_wide_key_saying_where() -> None:
    assert validated({"backend": "torch"}, MODEL_SETTINGS_SCHEMA, "here") == {"backend": "torch"}
    with pytest.raises(NamedSettingsError, match=r"^here: at the top level: .*'port' was unexpected"):
        validated({"port": 9000}, MODEL_SETTINGS_SCHEMA, "here")


def test_a_settings_file_that_cannot_be_read_or_parsed_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(NamedSettingsError, match=r"^model 'a': cannot read it"):
        read_yaml(tmp_path / "missing.yaml", "model 'a'")
    broken = tmp_path / "broken.yaml"
    broken.write_text("backend: [", encoding="utf-8")
    with pytest.raises(NamedSettingsError, match=r"^model 'a': not valid YAML"):
        read_yaml(broken, "model 'a'")
    good = tmp_path / "good.yaml"
    good.write_text("backend: openvino\n", encoding="utf-8")
    assert read_yaml(good, "model 'a'") == {"backend": "openvino"}
