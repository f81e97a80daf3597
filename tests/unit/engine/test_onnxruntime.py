"""The onnxruntime backend's own behaviour: its fused graph, and where it sends bfloat16.

What every graph backend does alike (refusals, description, the check against torch, serving)
is in test_graph.py, which runs on this backend too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from maskserve.engine import BackendUnavailable, FillMaskEngine
from tests.unit.engine.conftest import ONNXRUNTIME

pytestmark = ONNXRUNTIME.needed


def test_describes_its_fused_graph(onnx_bert_engine: FillMaskEngine) -> None:
    # The first layer's attention is fused; the last one's reads rows only, which no fusion knows.
    assert onnx_bert_engine.describe()["read_rows_last_layer"] == "yes"
    assert "Attention 1" in str(onnx_bert_engine.describe()["fused_operators"])


def test_bfloat16_is_sent_to_the_backends_that_run_it(bert_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match=r"use --backend openvino or --backend torch for it"):
        ONNXRUNTIME.load(bert_dir, tmp_path, dtype="bfloat16")
