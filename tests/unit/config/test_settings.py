"""Settings: defaults, flag over environment over default, and refusals that name the culprit."""

from __future__ import annotations

import dataclasses

import pytest

from maskserve.config.flags import load_settings
from maskserve.config.settings import ENV_PREFIX, Settings, setting_fields

FIELDS = [f.name for f in setting_fields()]
# A valid value for each field that differs from its default, as text (flag and env form).
OTHER_VALUES: dict[str, tuple[str, object]] = {
    "host": ("0.0.0.0", "0.0.0.0"),
    "port": ("9001", 9001),
    "model": ("/models/bert", ("/models/bert",)),
    "models_file": ("/etc/maskserve/models.yaml", "/etc/maskserve/models.yaml"),
    "model_repository": ("/srv/models", "/srv/models"),
    "model_control_mode": ("on-demand", "on-demand"),
    "models_memory": ("1500MiB", "1500MiB"),
    "model_load_timeout": ("120", 120.0),
    "model_min_residency": ("0", 0.0),
    "control_key": ("c" * 20, "c" * 20),
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
    "max_text_tokens": ("600", 600),
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
    "grpc_port": ("8001", 8001),
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
    "max_text_tokens": "0",
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
    "grpc_port": "-1",
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
    "model_control_mode": "poll",
    "models_memory": "lots",
    "model_load_timeout": "0",
    "model_min_residency": "-1",
    "control_key": "short",
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
    assert (settings.max_queue, settings.max_body_bytes, settings.max_text_chars) == (4096, 1_048_576, 32_768)
    assert (settings.max_text_tokens, settings.max_score_tokens, settings.max_masks_per_text) == (4096, 4096, 8)
    assert (settings.max_top_k, settings.default_top_k, settings.log_json) == (100, 5, False)


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().port = 1  # type: ignore[misc]


def assert_names_value(message: str, name: str) -> None:
    if name in SECRET:  # a secret is never echoed, not even a wrong one
        assert BAD_VALUES[name] not in message and "(hidden)" in message
    else:
        assert repr(BAD_VALUES[name]) in message
