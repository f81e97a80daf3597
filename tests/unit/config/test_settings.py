"""Settings: defaults, flag over environment over default, and refusals that name the culprit."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

import maskserve
from maskserve.config.settings import (
    BOUNDS,
    ENV_PREFIX,
    GROUPS,
    Settings,
    SettingsError,
    available_cpus,
    build_parser,
    contradictions,
    followed,
    load_settings,
    setting_fields,
)
from tests.live_server import run_maskserve

FIELDS = [f.name for f in setting_fields()]
# A valid value for each field that differs from its default, as text (flag and env form).
OTHER_VALUES: dict[str, tuple[str, object]] = {
    "host": ("0.0.0.0", "0.0.0.0"),
    "port": ("9001", 9001),
    "model": ("/models/bert", ("/models/bert",)),
    "models_file": ("/etc/maskserve/models.yaml", "/etc/maskserve/models.yaml"),
    "device": ("auto", "auto"),
    "dtype": ("float16", "float16"),
    "quantize": ("int8", "int8"),
    "threads": ("3", 3),
    "backend": ("onnxruntime", "onnxruntime"),
    "cache_dir": ("/var/cache/maskserve", "/var/cache/maskserve"),
    "max_batch_size": ("7", 7),
    "max_batch_tokens": ("999", 999),
    "max_batch_delay": ("0.005", 0.005),
    "max_queue": ("111", 111),
    "request_timeout": ("2.5", 2.5),
    "max_body_bytes": ("4096", 4096),
    "max_text_chars": ("77", 77),
    "max_inputs": ("3", 3),
    "max_top_k": ("9", 9),
    "max_targets": ("4", 4),
    "default_top_k": ("2", 2),
    "max_masks_per_text": ("3", 3),
    "max_predictions": ("500", 500),
    "max_score_tokens": ("50", 50),
    "max_word_copies": ("40", 40),
    "max_response_bytes": ("65536", 65536),
    "warmup": ("false", False),
    "agent_port": ("9101", 9101),
    "drain_delay": ("2", 2.0),
    "model_name": ("fill-mask-bert", "fill-mask-bert"),
    "workers": ("3", 3),
    "traces_exporter": ("Console, otlp", "console,otlp"),
    "drain_timeout": ("1.5", 1.5),
    "header_timeout": ("5", 5.0),
    "body_timeout": ("30", 30.0),
    "write_timeout": ("120", 120.0),
    "keepalive_timeout": ("75", 75.0),
    "max_connections": ("4000", 4000),
    "max_unsent_bytes": ("268435456", 268435456),
    "stall_timeout": ("45", 45.0),
    "log_level": ("debug", "debug"),
    "log_json": ("true", True),
    "middleware": ("default,-cors", "default,-cors"),
    "api_key": ("k" * 20, "k" * 20),
    "cors_origins": ("https://app.example.com", "https://app.example.com"),
}
BAD_VALUES: dict[str, str] = {
    "port": "70000",
    "device": "tpu",
    "dtype": "int8",
    "quantize": "int4",
    "threads": "many",
    "backend": "tensorrt",
    "max_batch_size": "0",
    "max_batch_tokens": "-5",
    "max_batch_delay": "-1",
    "max_queue": "1.5",
    "request_timeout": "0",
    "max_body_bytes": "big",
    "max_text_chars": "0",
    "max_inputs": "0",
    "max_top_k": "0",
    "max_targets": "x",
    "default_top_k": "0",
    "max_masks_per_text": "0",
    "max_predictions": "-1",
    "max_score_tokens": "0",
    "max_word_copies": "0",
    "max_response_bytes": "4MB",
    "warmup": "perhaps",
    "agent_port": "65536",
    "drain_delay": "-1",
    "model_name": "has/slash",
    "workers": "0",
    "traces_exporter": "none,console",
    "drain_timeout": "inf",
    "header_timeout": "0",
    "body_timeout": "-1",
    "write_timeout": "nan",
    "keepalive_timeout": "0",
    "max_connections": "0",
    "max_unsent_bytes": "1.5",
    "stall_timeout": "0",
    "log_level": "loud",
    "log_json": "maybe",
    "api_key": "short",
    "cors_origins": "ftp://files.example.com",
}
REFUSABLE = sorted(set(BAD_VALUES) & set(FIELDS))
SECRET = {f.name for f in setting_fields() if f.metadata.get("secret")}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env(name: str) -> str:
    return ENV_PREFIX + name.upper()


BOOLEAN = {f.name for f in setting_fields() if f.metadata.get("flag_kind") == "bool"}


def flag_args(name: str, raw: str) -> list[str]:
    if name in BOOLEAN:
        return [flag(name)] if raw == "true" else ["--no-" + flag(name).removeprefix("--")]
    return [flag(name), raw]


def test_every_field_is_covered_by_these_tests() -> None:
    missing = set(FIELDS) - set(OTHER_VALUES)
    assert not missing, f"add a valid non-default value for {sorted(missing)} to OTHER_VALUES (and BAD_VALUES)"


def test_defaults_without_flags_or_environment() -> None:
    settings = load_settings([], env={})
    assert settings == Settings()
    assert (settings.host, settings.port, settings.model) == ("127.0.0.1", 8000, ())
    assert (settings.device, settings.dtype, settings.threads) == ("cpu", "auto", 0)
    assert (settings.max_batch_size, settings.max_batch_tokens, settings.max_batch_delay) == (32, 8192, 0.0)
    assert (settings.max_queue, settings.max_body_bytes, settings.max_text_chars) == (256, 1_048_576, 10_000)
    assert (settings.max_top_k, settings.default_top_k, settings.log_json) == (100, 5, False)


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().port = 1  # type: ignore[misc]


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


def assert_names_value(message: str, name: str) -> None:
    if name in SECRET:  # a secret is never echoed, not even a wrong one
        assert BAD_VALUES[name] not in message and "(hidden)" in message
    else:
        assert repr(BAD_VALUES[name]) in message


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


def test_help_lists_every_flag_and_its_variable() -> None:
    text = build_parser().format_help()
    for name in FIELDS:
        assert flag(name) in text
        assert env(name) in text


def test_cli_help_lists_every_flag() -> None:
    result = run_maskserve("--help", timeout_s=60)
    assert result.returncode == 0, result.stderr
    # argparse wraps long lines; flags stay whole.
    for name in FIELDS:
        assert flag(name) in result.stdout


def test_the_traces_exporter_falls_back_to_opentelemetrys_own_variable() -> None:
    assert load_settings([], env={"OTEL_TRACES_EXPORTER": "console"}).traces_exporter == "console"
    both = {"MASKSERVE_TRACES_EXPORTER": "otlp", "OTEL_TRACES_EXPORTER": "console"}
    assert load_settings([], env=both).traces_exporter == "otlp"  # maskserve's own wins
    with pytest.raises(SettingsError, match=r"^OTEL_TRACES_EXPORTER: invalid value 'otlp,none'"):
        load_settings([], env={"OTEL_TRACES_EXPORTER": "otlp,none"})


# Both values written by the user: refused, naming both (and where each came from).
CONTRADICTIONS = [
    (["--max-inputs", "300", "--max-queue", "256"], {}, ("--max-inputs=300", "--max-queue=256")),
    (["--max-queue", "10"], {"MASKSERVE_MAX_INPUTS": "64"}, ("MASKSERVE_MAX_INPUTS=64", "--max-queue=10")),
    (["--max-queue", "8", "--max-score-tokens", "64"], {}, ("--max-score-tokens=64", "--max-queue=8")),
    ([], {"MASKSERVE_MAX_QUEUE": "8", "MASKSERVE_MAX_WORD_COPIES": "64"}, ("WORD_COPIES=64", "QUEUE=8")),
    (["--default-top-k", "50", "--max-top-k", "10"], {}, ("--default-top-k=50", "--max-top-k=10")),
    (["--default-top-k", "8", "--max-predictions", "4"], {}, ("--default-top-k=8", "--max-predictions=4")),
    (["--max-response-bytes", "2000", "--max-unsent-bytes", "1000"], {}, ("--max-unsent-bytes=1000", "bytes=2000")),
    ([], {"MASKSERVE_MAX_BATCH_DELAY": "45"}, ("MASKSERVE_MAX_BATCH_DELAY=45.0", "--request-timeout=")),
]


@pytest.mark.parametrize(("argv", "environ", "named"), CONTRADICTIONS)
def test_settings_that_contradict_each_other_are_refused_naming_both(
    argv: list[str], environ: dict[str, str], named: tuple[str, str]
) -> None:
    with pytest.raises(SettingsError, match="contradicts") as caught:
        load_settings(argv, env=environ)
    for name in named:
        assert name in str(caught.value)


# One limit written, by flag or by variable: each default bounded by it moves to fit, and nothing else.
FOLLOWED = [
    (
        ["--max-queue", "8"],
        {},
        {"max_inputs": 8, "max_score_tokens": 8, "max_word_copies": 8},
        {"max_inputs": "max_queue", "max_score_tokens": "max_queue", "max_word_copies": "max_queue"},
    ),
    (
        [],
        {"MASKSERVE_MAX_QUEUE": "100"},
        {"max_inputs": 64, "max_score_tokens": 100, "max_word_copies": 64},
        {"max_score_tokens": "max_queue"},
    ),
    (["--max-inputs", "300"], {}, {"max_queue": 300}, {"max_queue": "max_inputs"}),
    ([], {"MASKSERVE_MAX_SCORE_TOKENS": "400"}, {"max_queue": 400}, {"max_queue": "max_score_tokens"}),
    (["--max-word-copies", "500"], {}, {"max_queue": 500}, {"max_queue": "max_word_copies"}),
    (["--max-top-k", "3"], {}, {"default_top_k": 3}, {"default_top_k": "max_top_k"}),
    ([], {"MASKSERVE_MAX_PREDICTIONS": "2"}, {"default_top_k": 2}, {"default_top_k": "max_predictions"}),
    (
        ["--default-top-k", "3000"],
        {},
        {"max_top_k": 3000, "max_predictions": 3000},
        {"max_top_k": "default_top_k", "max_predictions": "default_top_k"},
    ),
    (
        [],
        {"MASKSERVE_MAX_UNSENT_BYTES": "1000"},
        {"max_response_bytes": 1000},
        {"max_response_bytes": "max_unsent_bytes"},
    ),
    (
        ["--max-response-bytes", str(64 * 1_048_576)],
        {},
        {"max_unsent_bytes": 64 * 1_048_576},
        {"max_unsent_bytes": "max_response_bytes"},
    ),
    # A written value inside the other's default moves nothing.
    (["--max-queue", "300"], {}, {"max_inputs": 64, "max_score_tokens": 256}, {}),
]


@pytest.mark.parametrize(("argv", "environ", "expected", "follows"), FOLLOWED)
def test_a_default_that_would_contradict_a_written_limit_follows_it(
    argv: list[str], environ: dict[str, str], expected: dict[str, int], follows: dict[str, str]
) -> None:
    settings = load_settings(argv, env=environ)
    assert {name: getattr(settings, name) for name in expected} == expected
    assert followed(settings) == follows
    assert not list(contradictions(settings))


def test_every_pair_that_can_contradict_is_one_that_follows_or_is_named() -> None:
    """Each bound is covered above both ways: refused when both are written, followed when one is."""
    refused = {(b.lower, b.upper) for b in BOUNDS}
    assert len(refused) == len(BOUNDS) == 6
    moved = {(name, other) for _, _, _, follows in FOLLOWED for name, other in follows.items()}
    for bound in BOUNDS:
        assert (bound.lower, bound.upper) in moved and (bound.upper, bound.lower) in moved, bound


def test_the_defaults_agree_with_each_other_and_follow_nothing() -> None:
    settings = load_settings([], env={})
    assert settings == Settings() and followed(settings) == {} and not list(contradictions(settings))
    assert settings.given == frozenset()


def test_help_says_which_defaults_follow_which_limits() -> None:
    helps = {action.dest: action.help or "" for action in build_parser()._actions}
    assert helps["max_score_tokens"].endswith("default 256, or the smallest of --max-queue you set, if smaller]")
    assert (
        "or the largest of --max-inputs, --max-score-tokens, --max-word-copies you set, if larger]"
        in helps["max_queue"]
    )
    assert helps["port"].endswith("; default 8000]")


def test_limits_that_agree_at_their_edges_are_accepted() -> None:
    settings = load_settings(["--max-inputs", "256", "--default-top-k", "100", "--max-batch-delay", "29.9"], env={})
    assert (settings.max_inputs, settings.default_top_k) == (256, 100)


def test_the_score_limit_lets_a_paragraph_through_by_default() -> None:
    assert Settings().max_score_tokens >= 256


def test_every_setting_sits_in_exactly_one_help_group() -> None:
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(FIELDS) and len(grouped) == len(set(grouped))


def test_help_shows_the_groups_in_order_and_version_prints_it() -> None:
    shown = run_maskserve("--help", timeout_s=60).stdout
    positions = [shown.index(f"\n{title}:\n") for title in GROUPS]
    assert positions == sorted(positions)
    version = run_maskserve("--version", timeout_s=60)
    assert version.returncode == 0 and version.stdout.strip() == f"maskserve {maskserve.__version__}"
