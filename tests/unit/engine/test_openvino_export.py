"""engine/openvino_export.py: the openvino graph's cache key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.models import build_bert
from tests.unit.engine.conftest import OPENVINO

pytestmark = OPENVINO.needed


@pytest.fixture
def fresh_bert(tmp_path: Path) -> Path:
    return build_bert(tmp_path / "bert")


def test_the_key_follows_the_weights_and_differs_from_the_onnx_key(fresh_bert: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForMaskedLM

    from maskserve.engine import openvino_export
    from maskserve.engine.export_cache import key_of

    model = AutoModelForMaskedLM.from_pretrained(str(fresh_bert))
    key, parts = openvino_export.export_key(model, True)
    assert parts["openvino"] and parts["weights_sha256"]
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0
    assert openvino_export.export_key(model, True)[0] != key
    assert key_of({**parts, "backend": "onnxruntime"}) != key
