"""Which models a server serves, by name, from --model and --models-file: names, files and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskserve.config.bounds import followed
from maskserve.config.flags import load_settings
from maskserve.config.model_configs import model_configs, source_name
from maskserve.config.settings import Settings, SettingsError
from maskserve.http.app import SETTINGS_CHECKS


def configs(*argv: str, env: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    settings = load_settings(list(argv), env=env or {}, checks=SETTINGS_CHECKS)
    return [(config.name, config.source) for config in model_configs(settings)]


def refusal(*argv: str) -> str:
    with pytest.raises(SettingsError) as caught:
        load_settings(list(argv), env={}, checks=SETTINGS_CHECKS)
    return str(caught.value)


def test_no_model_serves_the_default_model_under_model_name() -> None:
    assert configs() == [("maskserve", None)]
    assert configs("--model-name", "demo") == [("demo", None)]


def test_one_bare_model_keeps_model_name_as_before() -> None:
    assert configs("--model", "/models/bert-base") == [("maskserve", "/models/bert-base")]
    assert configs("--model", "/models/bert-base", "--model-name", "en") == [("en", "/models/bert-base")]


def test_several_models_are_named_by_name_or_by_folder_and_hub_name_in_order() -> None:
    assert configs("--model", "en=/models/bert", "--model", "/srv/xlm-roberta-base/", "--model", "org/camembert") == [
        ("en", "/models/bert"),
        ("xlm-roberta-base", "/srv/xlm-roberta-base/"),
        ("camembert", "org/camembert"),
    ]


def test_an_empty_model_serves_the_default_model_as_before() -> None:
    assert configs(env={"MASKSERVE_MODEL": ""}) == [("maskserve", None)]
    assert configs("--model", "") == [("maskserve", None)]


def test_the_variable_takes_several_models_comma_separated() -> None:
    assert configs(env={"MASKSERVE_MODEL": "en=/m/bert, fr=/m/camembert"}) == [
        ("en", "/m/bert"),
        ("fr", "/m/camembert"),
    ]


def test_a_bare_source_becomes_a_path_segment() -> None:
    assert source_name("/models/my model@v2") == "my-model-v2"
    assert source_name("google/electra-small-discriminator") == "electra-small-discriminator"
    assert source_name("/models/.hidden") == "hidden"


def test_a_duplicate_name_stops_the_start_naming_it() -> None:
    message = refusal("--model", "en=/a", "--model", "en=/b")
    assert "'en'" in message and "two models" in message


def test_a_bad_name_stops_the_start_naming_it() -> None:
    message = refusal("--model", "en/us=/a", "--model", "fr=/b")
    assert "'en/us'" in message and "A-Z a-z 0-9" in message


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_models_file_gives_each_model_its_own_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
models:
  - name: fast
    source: /models/distilbert
    backend: openvino
    quantize: int8
    max_batch_size: 8
    max_queue: 64
  - name: careful
    source: /models/bert-large
    dtype: bfloat16
    warmup: false
""",
    )
    settings = load_settings(["--model", "small=/models/tiny", "--models-file", path, "--max-queue", "100"], env={})
    served = {config.name: config for config in model_configs(settings)}
    assert list(served) == ["small", "fast", "careful"]  # --model first, then the file, in order
    assert served["small"].settings == settings
    fast = served["fast"].settings
    assert (fast.backend, fast.quantize, fast.max_batch_size, fast.max_queue) == ("openvino", "int8", 8, 64)
    careful = served["careful"].settings
    assert (careful.dtype, careful.warmup, careful.max_queue) == ("bfloat16", False, 100)  # the server's queue bound
    # Server-wide settings are the server's for every model.
    assert fast.port == careful.port == settings.port


def test_a_models_file_value_is_parsed_and_refused_like_its_flag(tmp_path: Path) -> None:
    message = refusal("--models-file", write(tmp_path, "models:\n  - name: a\n    max_queue: 0\n"))
    assert "model 'a'" in message and "max_queue" in message and "at least 1" in message


def test_a_models_file_model_whose_written_limits_contradict_is_refused(tmp_path: Path) -> None:
    message = refusal("--models-file", write(tmp_path, "models:\n  - name: a\n    max_queue: 8\n    max_inputs: 64\n"))
    assert "model 'a'" in message and "max_inputs=64 contradicts max_queue=8" in message


def test_a_models_file_limit_contradicting_a_written_server_flag_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  - name: a\n    max_queue: 8\n")
    message = refusal("--models-file", path, "--max-score-tokens", "64")
    assert "model 'a'" in message and "max_score_tokens=64 contradicts max_queue=8" in message


def test_a_models_file_models_defaults_follow_its_own_limits_afresh(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  - name: small\n    max_queue: 8\n  - name: big\n    max_queue: 512\n")
    settings = load_settings(["--models-file", path, "--max-queue", "16"], env={})
    assert (settings.max_inputs, settings.max_score_tokens) == (16, 16)  # the server's follow its queue
    served = {config.name: config.settings for config in model_configs(settings)}
    small, big = served["small"], served["big"]
    assert (small.max_inputs, small.max_score_tokens, small.max_word_copies) == (8, 8, 8)
    # Not the server's followed 16s: the defaults, which fit the model's own queue.
    assert (big.max_inputs, big.max_score_tokens, big.max_word_copies) == (64, 512, 64)
    assert followed(small) == {name: "max_queue" for name in ("max_inputs", "max_score_tokens", "max_word_copies")}


def test_model_name_with_no_source_serves_the_default_model_under_that_name() -> None:
    settings = load_settings(["--model", "english=", "--model", "other=/models/x"], env={})
    configs = model_configs(settings)
    assert [(config.name, config.source) for config in configs] == [("english", None), ("other", "/models/x")]
    assert [(c.name, c.source) for c in model_configs(load_settings([], env={"MASKSERVE_MODEL": "tiny="}))] == [
        ("tiny", None)
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models: [", "not valid YAML"),
        ("- name: a\n", "at the top level"),
        ("models:\n  - source: /a\n", "'name' is a required property"),
        ("models:\n  - name: a\n    port: 9000\n", "'port' was unexpected"),
        ("models:\n  - name: en/us\n", "models/0/name"),
    ],
)
def test_a_bad_models_file_is_refused_saying_where(tmp_path: Path, text: str, expected: str) -> None:
    message = refusal("--models-file", write(tmp_path, text))
    assert "--models-file" in message and expected in message


def test_a_missing_models_file_is_refused(tmp_path: Path) -> None:
    assert "cannot read it" in refusal("--models-file", str(tmp_path / "nope.yaml"))


def test_settings_built_in_code_serve_their_models_too() -> None:
    served = model_configs(Settings(model=("a=/x", "b=/y")))
    assert [(config.name, config.source) for config in served] == [("a", "/x"), ("b", "/y")]
