"""request/oip_model.py: the protocol's view of a served model, shared by REST and gRPC: its one
version, its metadata, and infer running the task its output names."""

from __future__ import annotations

import asyncio
import json

import pytest

from maskserve import __version__
from maskserve.errors import NotFound
from maskserve.request.keys import SERVICE_KEY
from maskserve.request.oip_model import (
    check_version,
    model_metadata_of,
    run_infer,
    server_metadata_of,
)
from maskserve.request.state import RequestState
from maskserve.service.served_model import MODEL_VERSION
from maskserve.tasks.oip_tensors import InferRequestParser
from tests.conftest import ClientFactory

PARIS = "Paris is the [MASK] of France."


def document(output: str | None = None, **parameters: object) -> dict[str, object]:
    found: dict[str, object] = {
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [PARIS]}],
        "parameters": parameters,
    }
    return found | ({"outputs": [{"name": output}]} if output else {})


async def test_the_one_version_is_served_and_any_other_is_404(make_client: ClientFactory) -> None:
    served = (await make_client()).app[SERVICE_KEY].default
    check_version(served, None)
    check_version(served, "")  # gRPC's unset field
    check_version(served, MODEL_VERSION)
    with pytest.raises(NotFound, match="it serves version '1'"):
        check_version(served, "2")


async def test_metadata_names_both_outputs_and_the_mask_token(make_client: ClientFactory) -> None:
    service = (await make_client()).app[SERVICE_KEY]
    metadata = model_metadata_of(service.default)
    assert [output["name"] for output in metadata["outputs"]] == ["predictions", "scores"]
    assert metadata["parameters"]["mask_token"] == "[MASK]" and metadata["versions"] == ["1"]
    assert server_metadata_of(service) == {
        "name": "maskserve",
        "version": __version__,
        "extensions": ["binary_tensor_data"],
    }


async def test_infer_runs_the_task_its_output_names(make_client: ClientFactory) -> None:
    client = await make_client()
    served = client.app[SERVICE_KEY].default
    parser = InferRequestParser(served.settings)

    async def run(parsed: dict[str, object]) -> list[object]:
        state = RequestState(deadline=asyncio.get_running_loop().time() + 30)
        inferred = await run_infer(state, served, parser.parse_document(parsed))
        assert state.answers == inferred.rows and state.windows == inferred.windows == (1,)
        return [json.loads(text) for text in inferred.texts_json]

    filled = await run(document(top_k=2))
    assert filled == await (await client.post("/", json={"inputs": [PARIS], "parameters": {"top_k": 2}})).json()
    scored = await run(document("scores", tokens=True))
    assert (
        scored == await (await client.post("/score", json={"inputs": [PARIS], "parameters": {"tokens": True}})).json()
    )
