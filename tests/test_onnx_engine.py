"""The onnxruntime backend: what it refuses, how it describes itself, and that it checks its graph.

Its answers are held to the pipeline's by tests/test_fidelity.py and tests/test_engine.py, which
run on both backends.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from maskserve.engine import BackendUnavailable, FillMaskEngine
from maskserve.model_api import ModelSpec, Query

from .conftest import HAS_ONNXRUNTIME, NO_ONNXRUNTIME, ClientFactory

pytestmark = pytest.mark.skipif(not HAS_ONNXRUNTIME, reason=NO_ONNXRUNTIME)

if HAS_ONNXRUNTIME:
    from maskserve.engine import onnxruntime as onnx_engine
    from maskserve.engine.export_cache import ExportFailed
    from maskserve.engine.onnxruntime import load_onnx_engine


def test_describes_its_backend_threads_and_export(onnx_bert_engine: FillMaskEngine) -> None:
    described = onnx_bert_engine.describe()
    assert described["backend"] == "onnxruntime"
    assert (described["device"], described["dtype"]) == ("cpu", "float32")
    assert described["onnxruntime_threads"] == 1 and described["torch_threads"] == 1
    assert described["mask_only_head"] == "yes"
    assert "Attention 2" in str(described["fused_operators"])  # both layers' attention fused
    path = Path(str(described["export_path"]))
    assert path.is_file() and path.parent.name == described["export_cache_key"]


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ({"device": "cuda"}, "--device cuda"),
        ({"dtype": "bfloat16"}, "--dtype bfloat16"),
        ({"dtype": "float16"}, "--dtype float16"),
        ({"quantize": "int8"}, "--quantize int8"),
    ],
)
def test_what_it_cannot_run_is_refused_naming_the_setting(
    option: dict[str, str], named: str, bert_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(BackendUnavailable, match=named) as caught:
        load_onnx_engine(ModelSpec(model=str(bert_dir), backend="onnxruntime", cache_dir=tmp_path, **option))
    assert "--backend torch" in str(caught.value)
    assert not (tmp_path / "onnx").exists()  # refused before anything is exported


def test_bfloat16_is_sent_to_the_backends_that_run_it(bert_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match=r"use --backend openvino or --backend torch for it"):
        load_onnx_engine(ModelSpec(model=str(bert_dir), backend="onnxruntime", cache_dir=tmp_path, dtype="bfloat16"))


def test_without_onnxruntime_it_says_what_to_install(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    with pytest.raises(BackendUnavailable, match=r"pip install 'maskserve\[onnx\]'"):
        load_onnx_engine(ModelSpec(model=str(bert_dir), backend="onnxruntime", cache_dir=tmp_path))


def test_a_graph_that_disagrees_with_torch_is_refused_and_not_cached(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = onnx_engine.run_graph

    def off_by_a_little(*args: object) -> np.ndarray:
        logits = real(*args)  # type: ignore[arg-type]
        logits[:, 7] += 0.5
        return logits

    monkeypatch.setattr(onnx_engine, "run_graph", off_by_a_little)
    with pytest.raises(ExportFailed, match="differ from torch's"):
        load_onnx_engine(ModelSpec(model=str(bert_dir), backend="onnxruntime", cache_dir=tmp_path))
    assert [p.name for p in (tmp_path / "onnx").iterdir()] == []


def test_torch_keeps_one_thread_beside_onnxruntime(onnx_bert_engine: FillMaskEngine) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # as a torch engine in the same process may have left it
        onnx_bert_engine.predict([Query(onnx_bert_engine.encode("the [MASK] is red."), 1)])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


async def test_serves_http_answers_and_info_names_the_backend(
    make_client: ClientFactory, onnx_bert_engine: FillMaskEngine, bert_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=onnx_bert_engine, backend="onnxruntime")
    response = await client.post("/", data="paris is the [MASK] of france.")
    assert response.status == 200
    answer = await response.json()
    [[expected]] = bert_engine.predict([Query(bert_engine.encode("paris is the [MASK] of france."), 5)])
    assert [p["token"] for p in answer] == [p["token"] for p in expected]
    info = await (await client.get("/info")).json()
    model = info["model"]
    assert model["backend"] == "onnxruntime" and model["onnxruntime_threads"] == 1
    assert model["export_path"].endswith("model.onnx") and len(model["export_cache_key"]) == 32
    assert info["versions"]["onnxruntime"]
