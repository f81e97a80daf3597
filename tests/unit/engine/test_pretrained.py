"""Loading a model (engine/pretrained.py): a missing folder refused on every backend, the refusals of
models that cannot fill masks, the device, the loading log line, and the default model found without
importing its package.

Tests that take ``load_on_backend`` run on each backend (torch, onnxruntime, openvino).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from maskserve.engine import FillMaskEngine, ModelLoadError, default_model_dir, load_engine, resolve_device
from tests.models import build_bert, build_maskless

Load = Callable[[str | None], FillMaskEngine]


def test_checkpoint_without_mlm_head_is_refused_naming_missing_weights(tmp_path: Path, load_on_backend: Load) -> None:
    folder = build_bert(tmp_path / "headless", with_head=False)
    with pytest.raises(ModelLoadError) as caught:
        load_on_backend(str(folder))
    message = str(caught.value)
    assert "lacks" in message and "masked-LM" in message
    assert "cls.predictions" in message, message  # names the missing weights


def test_tokenizer_without_mask_token_is_refused(tmp_path: Path, load_on_backend: Load) -> None:
    folder = build_maskless(tmp_path / "maskless")
    with pytest.raises(ModelLoadError, match="no mask token"):
        load_on_backend(str(folder))


def test_missing_folder_is_refused_naming_the_folder(tmp_path: Path, load_on_backend: Load) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError) as caught:
        load_on_backend(str(missing))
    assert str(caught.value) == f"could not load model {str(missing)!r}: no such folder {missing}"


def test_a_model_under_home_loads_from_its_tilde_path(bert_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(bert_dir.parent))
    engine = load_engine(f"~/{bert_dir.name}", threads=1)
    assert engine.name == f"~/{bert_dir.name}" and engine.source == str(bert_dir)


def test_cuda_without_a_gpu_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelLoadError, match="--device cuda"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


def test_loading_logs_source_device_threads_and_time(bert_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="maskserve.engine")
    engine = load_engine(str(bert_dir), threads=1)
    text = caplog.text
    assert str(bert_dir) in text and "cpu" in text and "1 torch threads" in text
    assert "model ready in" in text and "[MASK]" in text
    assert engine.device == torch.device("cpu")


def test_default_model_is_found_without_importing_its_package() -> None:
    import sys

    folder = default_model_dir()
    assert folder is not None and (folder / "config.json").is_file()
    assert folder.parts[-2:] == ("cognition", "model")
    assert "cognition" not in sys.modules
