"""/info: the served model, how it runs, the batching and breaker settings, the versions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
import transformers

import maskserve
from maskserve.engine import load_engine
from maskserve.engine.cpu import describe_features
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, EchoModel


async def test_info_describes_model_runtime_settings_and_versions(make_client: ClientFactory, bert_dir: Path) -> None:
    before = torch.get_num_threads()
    engine = load_engine(str(bert_dir), threads=3)
    # Another engine in the process sets torch's process-wide count: /info still tells this one's.
    torch.set_num_threads(1)
    try:
        client = await make_client(
            engine=engine,
            max_batch_size=7,
            max_queue=11,
            request_timeout=2.5,
            stall_timeout=45.0,
            max_text_tokens=1000,
            model_name="support-bert",
        )
        response = await client.get("/info")
    finally:
        torch.set_num_threads(before)
    assert response.status == 200
    info = await response.json()
    model = info["model"]
    assert model["mask_token"] == "[MASK]"
    assert model["architecture"] == "BertForMaskedLM"
    assert model["name"] == "support-bert"  # --model-name: what clients call it
    assert model["source"] == str(bert_dir)  # where it came from: a local folder, given by path
    assert (model["device"], model["dtype"]) == ("cpu", "float32")
    assert (model["precision"], model["cpu_matrix_features"]) == ("float32", describe_features())
    assert model["torch_threads"] == 3
    assert model["load_seconds"] > 0
    assert model["quantize"] == "none"
    assert model["backend"] == "torch" and model["export_path"] is None
    assert model["last_layer_precision"] is None  # openvino bfloat16's own
    assert info["batching"]["max_batch_size"] == 7
    # The long-text limit, beside the model's own length (windows are cut to the model's).
    assert (info["limits"]["max_text_tokens"], model["max_tokens"]) == (1000, 128)
    assert info["breaker"] == {
        "max_queue": 11,
        "request_timeout_s": 2.5,
        "drain_delay_s": 0.0,
        "drain_timeout_s": 10.0,
        "stall_timeout_s": 45.0,
    }
    assert info["connections"] == {
        "header_timeout_s": 10.0,
        "body_timeout_s": 10.0,
        "write_timeout_s": 60.0,
        "keepalive_timeout_s": 15.0,
        "max_connections": 1000,
        "max_unsent_bytes": 32 * 1_048_576,
    }
    versions = info["versions"]
    assert versions["maskserve"] == maskserve.__version__
    assert versions["torch"] == torch.__version__
    assert versions["transformers"] == transformers.__version__


async def test_info_of_a_model_that_cannot_describe_itself_leaves_those_fields_null(
    make_client: ClientFactory,
) -> None:
    client = await make_client(engine=EchoModel())
    response = await client.get("/info")
    assert response.status == 200
    info = await response.json()
    assert info["model"]["name"] == "maskserve"  # --model-name's default
    assert info["model"]["source"] == "echo"
    assert info["model"]["device"] is None
    assert info["versions"]["torch"] is None
    assert info["versions"]["maskserve"] == maskserve.__version__


async def test_info_never_runs_the_model(make_client: ClientFactory) -> None:
    model = ControlledModel()
    client = await make_client(engine=model)
    assert (await client.get("/info")).status == 200
    assert model.batches == []


def test_the_http_side_imports_neither_torch_nor_transformers() -> None:
    # In a fresh interpreter: this test process has imported torch already.
    code = (
        "import sys, maskserve.http.app, maskserve.api.health, maskserve.api.info, maskserve.observability.metrics;"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[]"
