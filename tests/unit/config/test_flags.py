"""Settings from flags and variables (config/flags.py): each field's flag and MASKSERVE_* variable,
their precedence, errors that name the flag or variable and the value, older names, --help."""

from __future__ import annotations

import pytest

import maskserve
from maskserve.config.flags import GROUPS, help_text, load_settings
from maskserve.config.settings import Settings, SettingsError
from tests.live_server import run_maskserve
from tests.unit.config.test_settings import (
    BAD_VALUES,
    BOOLEAN,
    FIELDS,
    OTHER_VALUES,
    REFUSABLE,
    assert_names_value,
    env,
    flag,
    flag_args,
)


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_reads_its_environment_variable(name: str) -> None:
    raw, expected = OTHER_VALUES[name]
    settings = load_settings([], env={env(name): raw})
    assert getattr(settings, name) == expected
    assert getattr(settings, name) != getattr(Settings(), name)


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_has_a_flag(name: str) -> None:
    raw, expected = OTHER_VALUES[name]
    assert getattr(load_settings(flag_args(name, raw), env={}), name) == expected


def test_flag_beats_environment_beats_default() -> None:
    assert load_settings([], env={}).max_batch_size == 32
    assert load_settings([], env={"MASKSERVE_MAX_BATCH_SIZE": "8"}).max_batch_size == 8
    assert load_settings(["--max-batch-size", "4"], env={"MASKSERVE_MAX_BATCH_SIZE": "8"}).max_batch_size == 4
    assert load_settings(["--no-log-json"], env={"MASKSERVE_LOG_JSON": "1"}).log_json is False


def test_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASKSERVE_PORT", "8123")
    assert load_settings([]).port == 8123


@pytest.mark.parametrize("name", [n for n in REFUSABLE if n not in BOOLEAN])  # --log-json takes no value
def test_bad_flag_value_names_flag_and_value(name: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings([flag(name), BAD_VALUES[name]], env={})
    assert flag(name) in str(caught.value)
    assert_names_value(str(caught.value), name)


@pytest.mark.parametrize("name", REFUSABLE)
def test_bad_environment_value_names_variable_and_value(name: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings([], env={env(name): BAD_VALUES[name]})
    assert env(name) in str(caught.value)
    assert_names_value(str(caught.value), name)


def test_negative_threads_are_refused_naming_the_flag_given() -> None:
    with pytest.raises(SettingsError, match=r"--threads: invalid value '-2'"):
        load_settings(["--threads", "-2"], env={})
    with pytest.raises(SettingsError, match=r"--torch-threads: invalid value '-2'"):
        load_settings(["--torch-threads", "-2"], env={})


def test_torch_threads_is_the_older_name_of_threads_as_a_flag_and_a_variable() -> None:
    assert load_settings(["--torch-threads", "3"], env={}).threads == 3
    assert load_settings([], env={"MASKSERVE_TORCH_THREADS": "3"}).threads == 3
    # The new name wins over the old, as a flag wins over a variable.
    assert load_settings(["--threads", "2", "--torch-threads", "3"], env={}).threads == 2
    assert load_settings([], env={"MASKSERVE_THREADS": "2", "MASKSERVE_TORCH_THREADS": "3"}).threads == 2
    assert load_settings(["--torch-threads", "1"], env={"MASKSERVE_THREADS": "2"}).threads == 1


def test_help_lists_every_flag_and_its_variable() -> None:
    text = help_text()
    for name in FIELDS:
        assert flag(name) in text
        assert env(name) in text


def test_cli_help_lists_every_flag() -> None:
    result = run_maskserve("--help", timeout_s=60)
    assert result.returncode == 0, result.stderr
    # click wraps long lines; flags stay whole.
    for name in FIELDS:
        assert flag(name) in result.stdout


def test_an_unknown_flag_a_missing_value_or_a_stray_argument_is_refused_naming_it() -> None:
    with pytest.raises(SettingsError, match=r"No such option.*--max-batch"):
        load_settings(["--max-batch", "4"], env={})  # no abbreviations: a flag is written whole
    with pytest.raises(SettingsError, match=r"--port.* requires an argument"):
        load_settings(["--port"], env={})
    with pytest.raises(SettingsError, match=r"unexpected extra argument \(serve\)"):
        load_settings(["serve"], env={})


def test_a_variable_set_empty_is_read_and_checked_like_any_value() -> None:
    with pytest.raises(SettingsError, match=r"^MASKSERVE_PORT: invalid value ''"):
        load_settings([], env={"MASKSERVE_PORT": ""})
    empty = load_settings([], env={"MASKSERVE_CORS_ORIGINS": ""})  # click alone would skip it
    assert empty.given == {"cors_origins"} and empty.cors_origins == ""


def test_the_traces_exporter_falls_back_to_opentelemetrys_own_variable() -> None:
    assert load_settings([], env={"OTEL_TRACES_EXPORTER": "console"}).traces_exporter == "console"
    both = {"MASKSERVE_TRACES_EXPORTER": "otlp", "OTEL_TRACES_EXPORTER": "console"}
    assert load_settings([], env=both).traces_exporter == "otlp"  # maskserve's own wins
    with pytest.raises(SettingsError, match=r"^OTEL_TRACES_EXPORTER: invalid value 'otlp,none'"):
        load_settings([], env={"OTEL_TRACES_EXPORTER": "otlp,none"})


def test_every_setting_sits_in_exactly_one_help_group() -> None:
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(FIELDS) and len(grouped) == len(set(grouped))


def test_help_shows_the_groups_in_order_and_version_prints_it() -> None:
    shown = run_maskserve("--help", timeout_s=60).stdout
    positions = [shown.index(f"\n{title}:\n") for title in GROUPS]
    assert positions == sorted(positions)
    version = run_maskserve("--version", timeout_s=60)
    assert version.returncode == 0 and version.stdout.strip() == f"maskserve {maskserve.__version__}"
