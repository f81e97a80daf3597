"""The model repository extension over gRPC (RepositoryIndex, RepositoryModelLoad and
RepositoryModelUnload in rpc/servicer.py), with tritonclient.grpc's asyncio client through the real
server: the same control, answers and errors as REST, as gRPC statuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import InferInput
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from tests.conftest import CONTROL_KEY
from tests.unit.rpc.conftest import GrpcApp, GrpcFactory

CONTROL = {"authorization": f"Bearer {CONTROL_KEY}"}
PARIS = "paris is the [MASK] of france."


async def repository_app(make_grpc: GrpcFactory, repository: Path, **overrides: object) -> GrpcApp:
    settings = {"model_control_mode": "explicit", "control_key": CONTROL_KEY} | overrides
    return await make_grpc(model_repository=str(repository), **settings)


def states(index: object) -> dict[str, str]:
    return {model.name: model.state for model in index.models}  # type: ignore[attr-defined]


def text_input(text: str) -> InferInput:
    tensor = InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    return tensor


async def test_tritonclient_grpc_lists_loads_and_unloads(make_grpc: GrpcFactory, model_repository: Path) -> None:
    app = await repository_app(make_grpc, model_repository)
    async with InferenceServerClient(app.address) as client:
        assert states(await client.get_model_repository_index()) == {
            "alpha": "READY",
            "beta": "UNAVAILABLE",
            "gamma": "UNAVAILABLE",
        }
        assert "model_repository" in (await client.get_server_metadata()).extensions
        await client.load_model("beta", headers=CONTROL, config=json.dumps({"max_top_k": 7}))
        assert await client.is_model_ready("beta")
        answer = await client.infer("beta", [text_input(PARIS)])
        over_grpc = json.loads(answer.as_numpy("predictions")[0])
        over_rest = await (await app.http.post("/models/beta", data=PARIS)).json()
        assert over_grpc == over_rest
        ready = await client.get_model_repository_index()
        assert states(ready)["beta"] == "READY"
        await client.unload_model("beta", headers=CONTROL)
        assert states(await client.get_model_repository_index())["beta"] == "UNAVAILABLE"
        with pytest.raises(InferenceServerException) as gone:
            await client.infer("beta", [text_input(PARIS)])
        assert gone.value.status() == "StatusCode.NOT_FOUND" and "is not loaded" in gone.value.message()


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, grpc.StatusCode.UNAUTHENTICATED),
        ({"authorization": "Bearer api-key-0123456789abc"}, grpc.StatusCode.PERMISSION_DENIED),
    ],
)
async def test_control_calls_need_the_control_key(
    make_grpc: GrpcFactory, model_repository: Path, headers: dict[str, str], status: grpc.StatusCode
) -> None:
    app = await repository_app(make_grpc, model_repository, api_key="api-key-0123456789abc")
    async with InferenceServerClient(app.address) as client:
        with pytest.raises(InferenceServerException) as refused:
            await client.load_model("beta", headers=headers)
        assert refused.value.status() == str(status)
        index = await client.get_model_repository_index(headers={"authorization": "Bearer api-key-0123456789abc"})
        assert states(index)["beta"] == "UNAVAILABLE"


async def test_errors_arrive_as_their_statuses(make_grpc: GrpcFactory, model_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(model_repository, tmp_path / "models")
    with open(tmp_path / "models" / "gamma" / "padding.bin", "wb") as padding:
        padding.truncate(2**31)
    app = await repository_app(make_grpc, tmp_path / "models", models_memory="1GiB")
    async with InferenceServerClient(app.address) as client:
        for name, config, status in (
            ("nosuch", None, grpc.StatusCode.NOT_FOUND),
            ("beta", '{"max_batch_size": 0}', grpc.StatusCode.INVALID_ARGUMENT),
            ("gamma", None, grpc.StatusCode.RESOURCE_EXHAUSTED),
        ):
            with pytest.raises(InferenceServerException) as refused:
                await client.load_model(name, headers=CONTROL, config=config)
            assert refused.value.status() == str(status), name
        assert states(await client.get_model_repository_index()) == {
            "alpha": "READY",
            "beta": "UNAVAILABLE",
            "gamma": "UNAVAILABLE",
        }


async def test_with_control_mode_none_the_repository_calls_are_unimplemented(
    make_grpc: GrpcFactory, model_repository: Path
) -> None:
    app = await make_grpc(model_repository=str(model_repository), model=("alpha",), control_key=CONTROL_KEY)
    async with InferenceServerClient(app.address) as client:
        for call in (client.get_model_repository_index(), client.load_model("beta", headers=CONTROL)):
            with pytest.raises(InferenceServerException) as off:
                await call
            assert off.value.status() == "StatusCode.UNIMPLEMENTED" and "--model-control-mode" in off.value.message()
        assert "model_repository" not in (await client.get_server_metadata()).extensions


async def test_on_demand_a_model_infer_loads_its_model(make_grpc: GrpcFactory, model_repository: Path) -> None:
    app = await make_grpc(model_repository=str(model_repository), model_control_mode="on-demand")
    async with InferenceServerClient(app.address) as client:
        answer = await client.infer("gamma", [text_input(PARIS)])
        assert len(json.loads(answer.as_numpy("predictions")[0])) == 5
        assert states(await client.get_model_repository_index())["gamma"] == "READY"
