"""engine/graph.py: what every graph backend does alike, each test run on onnxruntime and openvino.

What it refuses, how it describes itself, that it checks its graph against torch, that torch keeps
one thread beside it, and that it serves. Each backend's own behaviour is in its own file
(test_onnxruntime.py, test_openvino.py); their answers are held to the pipeline's by
test_fidelity.py and test_base.py, which run on every backend.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers import PreTrainedModel

from maskserve.engine import BackendUnavailable, FillMaskEngine
from maskserve.model_api import Query
from tests.conftest import ClientFactory
from tests.models import READ_ROWS_LAYOUTS, SMALL_ENCODER, build_distilbert
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


# -- the last layer at the read rows only, inside the graph --------------------------------------


def _masked_lm(model_type: str) -> PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **SMALL_ENCODER)
    model: PreTrainedModel = transformers.AutoModelForMaskedLM.from_config(config, attn_implementation="eager")
    return model.eval()  # type: ignore[no-untyped-call]


def _exported(graph: Graph, model: PreTrainedModel, folder: Path, *, read_rows: bool) -> Callable[..., np.ndarray]:
    """``model``'s graph, exported by ``graph``'s own export code into ``folder`` and opened, as a
    function of the graph's inputs."""
    folder.mkdir()
    if graph is ONNXRUNTIME:
        from maskserve.engine import onnx_export, onnxruntime

        onnx_export.export_graph(model, folder, read_rows=read_rows)
        session = onnxruntime.open_session(folder / graph.model_file, 1)
        return lambda inputs: onnxruntime.run_graph(session, inputs)
    from maskserve.engine import openvino, openvino_export

    openvino_export.convert_graph(model, folder, read_rows=read_rows)
    request = openvino.compile_graph(folder / graph.model_file, "f32", 1, keep_compiled=False).create_infer_request()
    return lambda inputs: openvino.run_graph(request, inputs)


def _padded_batch_read_out_of_order(pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Three texts, the last two padded, read at several rows each, the rows asked out of order."""
    generator = np.random.default_rng(1)
    ids = generator.integers(5, 120, (3, 11))
    attention = np.ones_like(ids)
    attention[1, 7:] = 0
    attention[2, 4:] = 0
    ids[attention == 0] = pad
    return ids, attention, np.array([2, 0, 1, 0, 0, 1]), np.array([3, 10, 0, 2, 5, 6])


@pytest.mark.parametrize("model_type", READ_ROWS_LAYOUTS)
def test_the_read_rows_graph_equals_the_whole_layer_graph_at_the_read_rows(
    graph: Graph, model_type: str, tmp_path: Path
) -> None:
    from maskserve.engine.onnx_export import feeds, read_rows_refusal

    model = _masked_lm(model_type)
    assert read_rows_refusal(model) is None
    ids, attention, rows, cols = _padded_batch_read_out_of_order(int(model.config.pad_token_id or 0))
    inputs = feeds(ids, attention, rows, cols)
    read = _exported(graph, model, tmp_path / "read", read_rows=True)(inputs)
    whole = _exported(graph, model, tmp_path / "whole", read_rows=False)(inputs)
    with torch.inference_mode():
        logits = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(attention)).logits
    expected = logits[torch.from_numpy(rows), torch.from_numpy(cols)].numpy()
    assert read.shape == whole.shape == (len(rows), SMALL_ENCODER["vocab_size"])
    np.testing.assert_allclose(read, whole, atol=1e-4, rtol=0)
    np.testing.assert_allclose(read, expected, atol=1e-4, rtol=0)
    # Whole-layer rows differ from row to row: a graph that read the wrong rows would fail above.
    assert np.abs(whole[0] - whole[1]).max() > 1e-2


@ONNXRUNTIME.needed
def test_the_read_rows_graph_computes_the_last_layer_at_the_read_rows_only(tmp_path: Path) -> None:
    """In the read-rows graph the last layer's products (query, attention, its output, the
    feed-forward) come after the gather of the read rows, as the head's do; in the whole-layer
    graph only the head's do. Counted in the fused graph onnxruntime serves."""
    import onnx

    from maskserve.engine import onnx_export

    def products_after_the_gather(read_rows: bool) -> int:
        folder = tmp_path / str(read_rows)
        folder.mkdir()
        onnx_export.export_graph(_masked_lm("bert"), folder, read_rows=read_rows)
        nodes = onnx.load(str(folder / ONNXRUNTIME.model_file)).graph.node  # topological order
        after = {"read_columns"}
        count = 0
        for node in nodes:
            if after & set(node.input):
                after.update(node.output)
                count += node.op_type in ("MatMul", "Gemm")
        return count

    head = products_after_the_gather(read_rows=False)
    assert head == 2  # the head's transform and decoder
    # query, scores, context, attention output, feed-forward in and out: six more.
    assert products_after_the_gather(read_rows=True) == head + 6


def test_another_layout_keeps_the_whole_last_layer_and_says_why(graph: Graph, tmp_path: Path) -> None:
    """DistilBERT's layer is not BERT's: its graph is the whole-layer one, and /info says so."""
    from maskserve.engine.onnx_export import read_rows_refusal

    folder = build_distilbert(tmp_path / "distilbert")
    engine = graph.load(folder, tmp_path / "cache")
    described = engine.describe()
    assert described["read_rows_last_layer"] == "no: the model is not an encoder and a head apart"
    assert engine.export.meta["read_rows_last_layer"] is False
    model = transformers.AutoModelForMaskedLM.from_pretrained(str(folder))
    assert read_rows_refusal(model) is not None
    [[predictions]] = engine.predict([Query(engine.encode("paris is the [MASK] of france."), 3)])
    assert len(predictions) == 3


def test_the_saving_is_in_use_and_described(graph: Graph, graph_engine: FillMaskEngine) -> None:
    assert graph_engine.describe()["read_rows_last_layer"] == "yes"
    assert graph_engine.export.meta["read_rows_last_layer"] is True  # type: ignore[attr-defined]
    assert graph_engine.export.meta["parts"]["read_rows_last_layer"] is True  # type: ignore[attr-defined]


def test_a_read_rows_graph_that_disagrees_gives_way_to_the_whole_layer_graph(
    graph: Graph, bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-rows graph off by more than the bound is refused, not cached; the whole-layer graph
    is made, served and cached under its own key, and /info says why."""
    from maskserve.engine import last_layer

    real = last_layer.ReadRowsLastLayer.__call__
    monkeypatch.setattr(last_layer.ReadRowsLastLayer, "__call__", lambda self, *args: real(self, *args) * 1.5)
    engine = graph.load(bert_dir, tmp_path)
    described = engine.describe()
    assert str(described["read_rows_last_layer"]).startswith("no: its read-rows graph was refused (")
    assert "differ from torch's" in str(described["read_rows_last_layer"])
    assert graph.entries(tmp_path) == [engine.export.key]
    assert engine.export.meta["parts"]["read_rows_last_layer"] is False
    # Unpatched, the next start makes the read-rows graph under another key; the two live side by side.
    monkeypatch.undo()
    again = graph.load(bert_dir, tmp_path)
    assert again.describe()["read_rows_last_layer"] == "yes" and not again.export.reused
    assert again.export.key != engine.export.key
    assert graph.entries(tmp_path) == sorted([engine.export.key, again.export.key])
    assert graph.load(bert_dir, tmp_path).export.reused
