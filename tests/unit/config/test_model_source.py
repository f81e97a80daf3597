"""A model's source (config/model_source.py): a path missing or a file refused in one line, a hub id
left to transformers, and every start-up model checked in order, named when there are several."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskserve.config.flags import load_settings
from maskserve.config.model_configs import model_configs
from maskserve.config.model_source import ModelLoadError, check_local_sources, local_source


@pytest.mark.parametrize(
    ("given", "resolved"),
    [
        ("/nonexistent/model", "/nonexistent/model"),
        ("./no-such-model", "{tmp}/work/no-such-model"),
        ("../no-such-model", "{tmp}/no-such-model"),
        ("~/models/bert", "{tmp}/home/models/bert"),
    ],
)
def test_a_missing_path_is_refused_as_a_missing_folder_in_one_line(
    given: str, resolved: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(ModelLoadError) as caught:
        local_source(given)
    assert str(caught.value) == f"could not load model {given!r}: no such folder {resolved.format(tmp=tmp_path)}"


@pytest.mark.parametrize("shape", ["absolute", "bare name"])
def test_a_file_given_as_the_model_is_refused_as_a_file_not_a_folder(
    shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    given = str(tmp_path / "config.json") if shape == "absolute" else "config.json"
    with pytest.raises(ModelLoadError) as caught:
        local_source(given)
    expected = (
        f"could not load model {given!r}: {tmp_path / 'config.json'} is a file, not a folder: give the model's folder"
    )
    assert str(caught.value) == expected


@pytest.mark.parametrize("given", ["google-bert/bert-base-uncased", "bert-base-uncased", "models/bert"])
def test_hub_ids_and_bare_relative_names_are_left_to_transformers(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert local_source(given) == given


def test_an_existing_folder_is_loaded_as_given_with_its_tilde_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "bert").mkdir()
    assert local_source("~/bert") == f"{tmp_path}/bert"
    assert local_source(str(tmp_path / "bert")) == str(tmp_path / "bert")
    monkeypatch.chdir(tmp_path)
    assert local_source("./bert") == "./bert" and local_source(".") == "."


def start_up_refusal(*argv: str) -> str | None:
    """What checking the start-up models of ``argv`` says, or None when every source may load."""
    try:
        check_local_sources(model_configs(load_settings(list(argv))))
    except ModelLoadError as exc:
        return str(exc)
    return None


def test_the_only_model_s_missing_folder_is_refused_as_the_engine_words_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert (
        start_up_refusal("--model", str(missing)) == f"could not load model {str(missing)!r}: no such folder {missing}"
    )


def test_of_several_models_the_first_refused_is_named(tmp_path: Path) -> None:
    there = tmp_path / "there"
    there.mkdir()
    a_file = tmp_path / "config.json"
    a_file.write_text("{}", encoding="utf-8")
    refusal = start_up_refusal("--model", f"a={there}", "--model", f"b={a_file}", "--model", f"c={tmp_path / 'gone'}")
    assert refusal == (
        f"model 'b': could not load model {str(a_file)!r}: {a_file} is a file, not a folder: give the model's folder"
    )


def test_the_default_model_hub_ids_and_existing_folders_pass(tmp_path: Path) -> None:
    assert start_up_refusal() is None
    assert start_up_refusal("--model", "org/some-model", "--model", f"local={tmp_path}") is None
