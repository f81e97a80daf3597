"""The Open Inference Protocol's view of a served model, for every transport (REST in ``api/oip.py``,
gRPC in ``rpc/``): its one version, its metadata and configuration, and infer, which runs the task
its requested output names through the one path every surface takes (:func:`run_recorded`).
No HTTP and no gRPC here.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from maskserve import __version__
from maskserve.errors import NotFound
from maskserve.model_api import describe_model
from maskserve.request.run_task import run_recorded
from maskserve.request.state import RequestState
from maskserve.service.health import Health, Problem, ready
from maskserve.service.registry import FillMaskService
from maskserve.service.served_model import MODEL_VERSION, ServedModel
from maskserve.serving.work_queue import Answer
from maskserve.tasks.fill_mask_request import FillMaskRequest
from maskserve.tasks.oip_tensors import DATATYPE, INPUT_NAME, OUTPUT_NAMES, InferRequest, InferRequestParser
from maskserve.tasks.score_request import ScoreRequest, text_score_json

# The protocol's platform names for what runs the model (its "Platforms" list has no eager PyTorch).
PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "openvino": "openvino"}


def server_metadata_of(service: FillMaskService) -> dict[str, Any]:
    """Who serves, and which protocol extensions."""
    # binary_tensor_data: Triton's binary form of tensors, which tritonclient uses by default;
    # model_repository: the index, load and unload, while --model-control-mode allows them.
    extensions = ["binary_tensor_data"]
    if service.control is not None and service.control.allows_changes:
        extensions.append("model_repository")
    return {"name": "maskserve", "version": __version__, "extensions": extensions}


def check_version(served: ServedModel, version: str | None) -> None:
    """A 404 unless ``version`` is None (or empty, as gRPC leaves an unset field) or the one served."""
    if version and version != MODEL_VERSION:
        raise NotFound(f"no version {version!r} of model {served.name!r} here; it serves version {MODEL_VERSION!r}")


def model_readiness(
    service: FillMaskService, name: str | None, version: str | None
) -> tuple[ServedModel | None, Health]:
    """Whether model ``name`` (the default for None or empty) at ``version`` serves now, and the model
    when it does: the server's readiness, plus a problem when no such model serves (unknown, not
    loaded, still loading, or another version). Triton's answer, which its clients poll after a
    load: not ready is an answer (REST's 400, gRPC's ``ready: false``), never an error."""
    health = ready(service)
    try:
        served = service.served(name or None)
        check_version(served, version)
    except NotFound as absent:
        return None, Health((*health.problems, Problem(absent.kind, absent.message)), health.facts)
    return served, health


def backend_of(served: ServedModel) -> str:
    model = served.parts.model if served.parts is not None else None
    return str(describe_model(model).get("backend", "torch")) if model is not None else "torch"


def model_metadata_of(served: ServedModel) -> dict[str, Any]:
    """The model's metadata: texts in, each output's JSON out, and what a client needs to build texts."""
    tensor = {"datatype": DATATYPE, "shape": [-1]}
    metadata: dict[str, Any] = {
        "name": served.name,
        "versions": [MODEL_VERSION],
        "platform": PLATFORMS.get(backend_of(served), "pytorch"),
        "inputs": [{"name": INPUT_NAME, **tensor}],
        "outputs": [{"name": name, **tensor} for name in OUTPUT_NAMES],
    }
    if served.parts is not None:
        model = served.parts.model
        metadata["parameters"] = {"mask_token": model.mask_token, "max_tokens": model.max_tokens}
    return metadata


# One per served model: the parser compiles its JSON schema once, not per request. Keyed by the
# served model itself, whose hash is its identity (hashing its frozen settings, some forty fields,
# would cost every request); a server's handful of models fills it.
@functools.lru_cache(maxsize=64)
def infer_parser(served: ServedModel) -> InferRequestParser:
    """The protocol's infer request parser, bound to ``served``'s limits."""
    return InferRequestParser(served.settings)


@dataclass(frozen=True)
class Inferred:
    """An infer request's answer: each text's output element (JSON), and how its texts were served."""

    texts_json: list[bytes]
    rows: list[Answer]
    windows: tuple[int, ...]


async def run_infer(state: RequestState, served: ServedModel, envelope: InferRequest) -> Inferred:
    """Run the task the request's output names: ``predictions`` fills masks, ``scores`` scores."""

    request = envelope.request
    if isinstance(request, ScoreRequest):
        asked_score = request

        async def read_score() -> ScoreRequest:
            return asked_score

        scored = await run_recorded(state, served, served.score, read_score)
        texts = [
            json.dumps(text_score_json(score, asked_score.tokens, count)).encode()
            for score, count in zip(scored.result, scored.windows, strict=True)
        ]
        return Inferred(texts, list(scored.rows), tuple(scored.windows))
    asked_fill: FillMaskRequest = request

    async def read_fill() -> FillMaskRequest:
        return asked_fill

    filled = await run_recorded(state, served, served.fill_mask, read_fill)
    return Inferred([answer.json for answer in filled.result], list(filled.rows), tuple(filled.windows))
