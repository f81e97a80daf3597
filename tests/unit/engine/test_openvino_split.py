"""The openvino graph cut before its last layer: the parts answer as the whole graph, the cut holds
on each tokenizer family's model, and a graph that cannot be cut runs whole in bfloat16, saying so.

bfloat16's agreement with the last layer in float32 is in test_bfloat16.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from maskserve.config.settings import Settings
from maskserve.engine import FillMaskEngine
from maskserve.engine.cpu import native_bf16
from maskserve.http.app import load_model
from tests.conftest import HAS_OPENVINO, ClientFactory, load_openvino
from tests.models import build_bert
from tests.unit.engine.conftest import OPENVINO

pytestmark = OPENVINO.needed

if HAS_OPENVINO:
    from maskserve.engine import openvino as ov_engine
    from maskserve.engine import openvino_split
    from maskserve.engine.openvino_quantize import graph_batches

TEXTS = ("paris is the [MASK] of france.", "the [MASK] barked at the [MASK].", "[MASK] is a city.")


def probe_batch(engine: FillMaskEngine) -> dict[str, np.ndarray]:
    texts = [text.replace("[MASK]", engine.tokenizer.mask_token) for text in TEXTS]
    return graph_batches([engine.encode(text) for text in texts], engine.tokenizer, len(texts))[0]


def parts_of(engine: FillMaskEngine) -> openvino_split.GraphParts:
    core = ov_engine.shared_core()
    parts = openvino_split.cut_before_last_layer(core.read_model(str(engine.export.model_file)))
    assert parts is not None
    return parts


@pytest.mark.parametrize("fixture", ["ov_bert_engine", "ov_roberta_engine"])
def test_the_two_parts_answer_as_the_whole_graph(fixture: str, request: pytest.FixtureRequest) -> None:
    engine: FillMaskEngine = request.getfixturevalue(fixture)
    parts = parts_of(engine)
    core = ov_engine.shared_core()
    config = {"INFERENCE_PRECISION_HINT": "f32"}
    split = openvino_split.SplitCompiled(
        core.compile_model(parts.body, "CPU", config), core.compile_model(parts.tail, "CPU", config)
    )
    batch = probe_batch(engine)
    whole = core.compile_model(core.read_model(str(engine.export.model_file)), "CPU", config)
    expected = whole.create_infer_request().infer(batch)[0]
    got = split.create_infer_request().infer(batch)[0]
    assert got.shape == expected.shape == (4, len(engine.tokenizer))  # one row per mask
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("fixture", ["ov_bert_engine", "ov_roberta_engine"])
def test_the_tail_is_the_last_layer_and_the_head_only(fixture: str, request: pytest.FixtureRequest) -> None:
    engine: FillMaskEngine = request.getfixturevalue(fixture)
    parts = parts_of(engine)
    tail_layers, body_layers = (
        {openvino_split.layer_of(op) for op in part.get_ordered_ops() if op.get_type_name() == "MatMul"}
        for part in (parts.tail, parts.body)
    )
    last = max(layer for layer in body_layers | tail_layers if layer is not None)
    assert tail_layers == {last, None}  # the last layer's products and the head's
    assert body_layers == set(range(last))  # every earlier layer, nothing of the last one
    assert openvino_split.HIDDEN_INPUT in {name for port in parts.tail.inputs for name in port.get_names()}


def test_a_one_layer_graph_is_not_cut(tmp_path: Path) -> None:
    # Its tail would be the whole encoder: nothing to keep apart.
    engine = load_openvino(str(build_bert(tmp_path / "one-layer", num_hidden_layers=1)), tmp_path / "cache")
    core = ov_engine.shared_core()
    assert openvino_split.cut_before_last_layer(core.read_model(str(engine.export.model_file))) is None


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no AMX or AVX-512 BF16: OpenVINO refuses bfloat16 here")
def test_bfloat16_where_the_graph_cannot_be_cut_runs_whole_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = build_bert(tmp_path / "one-layer", num_hidden_layers=1)
    with caplog.at_level(logging.WARNING, logger="maskserve.engine.openvino"):
        engine = load_openvino(str(model), tmp_path / "cache", dtype="bfloat16")
    assert engine.describe()["last_layer_precision"] == "bfloat16"
    assert ov_engine.precision_of(engine.compiled) == "bf16"
    assert "cannot be cut before its last layer: all of it runs in bfloat16" in caplog.text


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no AMX or AVX-512 BF16: OpenVINO refuses bfloat16 here")
async def test_bfloat16_serves_http_and_info_says_its_last_layer_runs_in_float32(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    settings = Settings(backend="openvino", dtype="bfloat16", cache_dir=str(tmp_path), threads=1)
    engine = load_model(settings)
    client = await make_client(engine=engine, backend="openvino", dtype="bfloat16")
    response = await client.post("/", data="Paris is the [MASK] of France.")
    assert response.status == 200
    answer = await response.json()
    assert len(answer) == 5 and all(0 < p["score"] <= 1 and "[MASK]" not in p["sequence"] for p in answer)
    model = (await (await client.get("/info")).json())["model"]
    assert (model["dtype"], model["last_layer_precision"]) == ("bfloat16", "float32")
    assert model["precision"] in ("bfloat16 on AMX", "bfloat16 on AVX-512 BF16")
