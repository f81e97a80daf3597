"""engine/onnx_export.py: the graph's inputs, and its ONNX export's failures said in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from maskserve.engine.export_cache import ExportFailed
from maskserve.engine.onnx_export import INPUTS, feeds
from tests.models import build_bert
from tests.unit.engine.conftest import ONNXRUNTIME


def test_the_graph_is_fed_the_batch_and_its_read_positions() -> None:
    ids = np.array([[101, 4, 7, 102], [101, 9, 4, 4]])
    attention = np.ones_like(ids)
    rows, cols = np.nonzero(ids == 4)
    inputs = feeds(ids, attention, rows, cols)
    assert list(inputs) == list(INPUTS)
    assert inputs["read_columns"].tolist() == [[1, 0], [2, 3]]  # row 0 reads one column, padded
    assert inputs["read_index"].tolist() == [0, 2, 3]
    assert all(array.dtype == np.int64 for array in inputs.values())


@ONNXRUNTIME.needed
def test_an_exporter_error_becomes_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Exporting the operator 'aten::fake' to ONNX is not supported.\nMore detail.")

    monkeypatch.setattr(torch.onnx, "export", fail)
    with pytest.raises(ExportFailed) as caught:
        ONNXRUNTIME.load(build_bert(tmp_path / "bert"), tmp_path / "cache")
    message = str(caught.value)
    assert (
        message == "could not export the model to ONNX: Exporting the operator 'aten::fake' to ONNX is not supported."
    )
    assert ONNXRUNTIME.entries(tmp_path / "cache") == []
