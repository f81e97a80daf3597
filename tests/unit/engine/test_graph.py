"""engine/graph.py: what every graph backend does alike, each test run on onnxruntime and openvino.

What it refuses, how it describes itself, that it checks its graph against torch, that torch keeps
one thread beside it, and that it serves. Each backend's own behaviour is in its own file
(test_onnxruntime.py, test_openvino.py); their answers are held to the pipeline's by
test_fidelity.py and test_base.py, which run on every backend.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from maskserve.engine import BackendUnavailable, FillMaskEngine
from maskserve.model_api import Query
from tests.conftest import ClientFactory
from tests.unit.engine.conftest import ONNXRUNTIME, OPENVINO, Graph


def test_describes_its_backend_threads_and_graph(graph: Graph, graph_engine: FillMaskEngine) -> None:
    described = graph_engine.describe()
    assert described["backend"] == graph.backend
    assert (described["device"], described["dtype"]) == ("cpu", "float32")
    assert described[f"{graph.backend}_threads"] == 1 and described["torch_threads"] == 1
    assert described["mask_only_head"] == "yes"
    assert described[f"{graph.backend}_version"] == importlib.import_module(graph.backend).__version__
    path = Path(str(described["export_path"]))
    assert path.is_file() and path.name == graph.model_file
    assert path.parent.name == described["export_cache_key"]


@pytest.mark.parametrize(
    ("graph", "option", "named"),
    [
        pytest.param(
            graph, option, f"--{name} {option[name]}", id=f"{graph.backend}-{option[name]}", marks=graph.needed
        )
        for graph, option in (
            (ONNXRUNTIME, {"device": "cuda"}),
            (ONNXRUNTIME, {"dtype": "bfloat16"}),
            (ONNXRUNTIME, {"dtype": "float16"}),
            (ONNXRUNTIME, {"quantize": "int8"}),
            (OPENVINO, {"device": "cuda"}),
            (OPENVINO, {"dtype": "float16"}),
        )
        for name in option
    ],
)
def test_what_it_cannot_run_is_refused_naming_the_setting(
    graph: Graph, option: dict[str, str], named: str, bert_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(BackendUnavailable, match=named) as caught:
        graph.load(bert_dir, tmp_path, **option)
    assert "--backend torch" in str(caught.value)
    assert not (tmp_path / graph.folder).exists()  # refused before any graph is made


def test_without_its_runtime_it_says_what_to_install(
    graph: Graph, bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, graph.backend, None)  # importing the runtime now raises ImportError
    with pytest.raises(BackendUnavailable, match=rf"pip install 'maskserve\[{graph.extra}\]'"):
        graph.load(bert_dir, tmp_path)


def test_a_graph_that_disagrees_with_torch_is_refused_and_not_cached(
    graph: Graph, bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from maskserve.engine.export_cache import ExportFailed

    module = importlib.import_module(f"maskserve.engine.{graph.backend}")
    real = module.run_graph

    def off_by_a_little(*args: object) -> np.ndarray:
        logits: np.ndarray = real(*args).copy()
        logits[:, 7] += 0.5
        return logits

    monkeypatch.setattr(module, "run_graph", off_by_a_little)
    with pytest.raises(ExportFailed, match="differ from torch's"):
        graph.load(bert_dir, tmp_path)
    assert graph.entries(tmp_path) == []


def test_torch_keeps_one_thread_beside_the_graph(graph_engine: FillMaskEngine) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # as a torch engine in the same process may have left it
        graph_engine.predict([Query(graph_engine.encode("the [MASK] is red."), 1)])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


async def test_serves_http_answers_and_info_names_the_backend(
    graph: Graph, graph_engine: FillMaskEngine, bert_engine: FillMaskEngine, make_client: ClientFactory
) -> None:
    client = await make_client(engine=graph_engine, backend=graph.backend)
    response = await client.post("/", data="paris is the [MASK] of france.")
    assert response.status == 200
    answer = await response.json()
    [[expected]] = bert_engine.predict([Query(bert_engine.encode("paris is the [MASK] of france."), 5)])
    assert [p["token"] for p in answer] == [p["token"] for p in expected]
    info = await (await client.get("/info")).json()
    model = info["model"]
    assert model["backend"] == graph.backend and model[f"{graph.backend}_threads"] == 1
    assert model["export_path"].endswith(graph.model_file) and len(model["export_cache_key"]) == 32
    assert info["versions"][graph.backend]
    metadata = await (await client.get("/v2/models/maskserve")).json()
    assert metadata["platform"] == graph.platform
