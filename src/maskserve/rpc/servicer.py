"""``inference.GRPCInferenceService``: each RPC an adapter over the service, as ``api/oip.py`` is for
REST. Metadata and readiness read the same functions, ``ModelInfer`` parses into the same request
and runs the same task path (``request/oip_model.py``): the same parser, admission at the door and
on the whole cost, batcher, windows, cost bounds and errors.

``ModelStreamInfer`` answers a stream of infer requests in the order they came, each admitted and
batched on its own (so a stream's requests share forward passes with each other and with every
other client's); an error answers that request alone, in ``error_message``, and the stream goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from maskserve.config.settings import Settings
from maskserve.middleware.error_sanitizer import new_request_id
from maskserve.request.across_workers import load_everywhere, merged_index, unload_everywhere
from maskserve.request.model_repository import checked_name, control_of, entry_json, load_overrides
from maskserve.request.oip_model import (
    check_version,
    infer_parser,
    model_metadata_of,
    model_readiness,
    run_infer,
    server_metadata_of,
)
from maskserve.request.run_task import held_model
from maskserve.request.state import RequestState
from maskserve.rpc.calls import Calls, public_message, request_id
from maskserve.rpc.protocol import ModelConfig, ModelStreamInferResponse, method_types
from maskserve.rpc.status import REQUEST_ID_KEY, status_code, trailers
from maskserve.rpc.tensors import infer_response, parameter_value, parse_infer
from maskserve.service.health import live, ready
from maskserve.service.served_model import MODEL_VERSION, ServedModel
from maskserve.tasks.oip_tensors import INPUT_NAME, OUTPUT_NAMES

# The RPCs answered without an API key, as their REST routes are: probes hold no secrets.
PUBLIC = frozenset({"ServerLive", "ServerReady", "ModelReady"})
# A stream's requests read ahead of the one being answered: they queue and batch together, while
# a client that sends faster than it reads is held back here rather than by the queue.
STREAM_READ_AHEAD = 64


def _response(method: str, **fields: Any) -> Any:
    return method_types(method)[1](**fields)


class InferenceServicer:
    """The service's RPCs, by name; each runs inside :meth:`Calls.call`."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.service = calls.service

    def _served(self, state: RequestState, name: str, version: str) -> ServedModel:
        # An empty name is the default model, as POST / serves it (gRPC leaves unset fields empty).
        served = self.service.served(name or None)
        state.served, state.model = served, served.name
        check_version(served, version)
        return served

    async def ServerLive(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            return _response("ServerLive", live=live(self.service).ok)

        return await self.calls.unary("ServerLive", context, answer, public=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            return _response("ServerReady", ready=ready(self.service).ok)

        return await self.calls.unary("ServerReady", context, answer, public=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            # OK with ready false for a model not serving (unknown, not loaded, loading), as Triton
            # answers: its clients poll this after a load, and a status would raise there.
            served, health = model_readiness(self.service, request.name, request.version)
            if served is not None:
                state.served, state.model = served, served.name
            return _response("ModelReady", ready=health.ok)

        return await self.calls.unary("ModelReady", context, answer, public=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            return _response("ServerMetadata", **server_metadata_of(self.service))

        return await self.calls.unary("ServerMetadata", context, answer)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            metadata = model_metadata_of(self._served(state, request.name, request.version))
            metadata.pop("parameters", None)  # the gRPC message has none; ModelConfig carries them
            return _response("ModelMetadata", **metadata)

        return await self.calls.unary("ModelMetadata", context, answer)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            return _response("ModelConfig", config=model_config(self._served(state, request.name, request.version)))

        return await self.calls.unary("ModelConfig", context, answer)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            if request.name:
                names = [self._served(state, request.name, request.version).name]
            else:
                names = list(self.service.models)
            response = _response("ModelStatistics")
            for name in names:
                add_statistics(response.model_stats.add(), name, self.service.metrics.model_statistics(name))
            return response

        return await self.calls.unary("ModelStatistics", context, answer)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            control = control_of(self.service)
            entries = [entry_json(entry) for entry in control.index(ready_only=request.ready)]
            if self.service.peers is not None:
                entries = await merged_index(self.service.peers, entries, request.ready)
            response = _response("RepositoryIndex")
            for entry in entries:
                response.models.add(**{key: entry.get(key, "") for key in ("name", "version", "state", "reason")})
            return response

        return await self.calls.unary("RepositoryIndex", context, answer)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            control = control_of(self.service)
            authorization = self._check_control(context)
            name = checked_name(control, request.model_name)  # before anything is loaded or forwarded
            parameters = {key: parameter_value(value) for key, value in request.parameters.items()}
            overrides = load_overrides(name, parameters)
            config = parameters.get("config")
            body = json.dumps({"parameters": {"config": config}} if config is not None else {}).encode()
            await load_everywhere(
                self.service,
                control,
                name,
                overrides,
                body=body,
                authorization=authorization,
                actor=f"{context.peer()} (request {state.id})",
                change=state.id,
            )
            return _response("RepositoryModelLoad")

        return await self.calls.unary("RepositoryModelLoad", context, answer, control=True)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            control = control_of(self.service)
            authorization = self._check_control(context)
            name = checked_name(control, request.model_name)
            actor = f"{context.peer()} (request {state.id})"
            await unload_everywhere(
                self.service, control, name, authorization=authorization, actor=actor, change=state.id
            )
            return _response("RepositoryModelUnload")

        return await self.calls.unary("RepositoryModelUnload", context, answer, control=True)

    def _check_control(self, context: Any) -> str | None:
        """The control key, checked; the call's authorization, for the sibling workers."""
        metadata = tuple(context.invocation_metadata() or ())
        self.calls.check_control(metadata)
        return next((str(value) for key, value in metadata if key == "authorization"), None)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        async def answer(state: RequestState) -> Any:
            return await self._infer(state, request)

        return await self.calls.unary("ModelInfer", context, answer)

    async def _infer(self, state: RequestState, request: Any) -> Any:
        deadline = state.deadline
        assert deadline is not None  # the call fixed it

        async def resolve() -> ServedModel:
            control = self.service.control
            if control is not None:  # a model of the repository not loaded yet loads here (on-demand)
                await control.load_on_demand(request.model_name or None, deadline)
            return self._served(state, request.model_name, request.model_version)

        # Held from its resolution, as a REST route holds its model before its body: a reload in
        # between cannot fail it.
        async with held_model(state, resolve) as served:
            served.at_door(deadline)  # the circuit breaker's door, before any parsing
            envelope, raw = parse_infer(infer_parser(served), request)  # as REST's infer parses its body
            inferred = await run_infer(state, served, envelope)
        version = request.model_version or MODEL_VERSION
        return infer_response(served.name, version, envelope, inferred.texts_json, raw)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Each request of the stream answered in turn; see the module docstring. The key is
        checked once, for the stream; each request has its own record, id, metrics and access line."""
        metadata = tuple(context.invocation_metadata() or ())
        stream_id = request_id(metadata)
        if self.calls.keys:  # a refused stream is counted and logged, as a refused call is
            refused = RequestState(id=stream_id)

            async def nothing(state: RequestState) -> None:
                return None

            _, error = await self.calls.run("ModelStreamInfer", context, refused, nothing, metadata, authorize=True)
            if error is not None:
                await context.abort(status_code(error), public_message(error, refused), trailers(error, stream_id))
        context.set_trailing_metadata(((REQUEST_ID_KEY, stream_id),))
        pending: asyncio.Queue[asyncio.Task[Any] | None] = asyncio.Queue(STREAM_READ_AHEAD)

        async def read() -> None:
            try:
                async for request in requests:
                    await pending.put(asyncio.create_task(self._stream_one(request, context, metadata)))
            finally:
                await pending.put(None)

        reader = asyncio.create_task(read())
        try:
            while (answering := await pending.get()) is not None:
                yield await answering
            await reader  # a broken stream's error ends the call
        finally:
            reader.cancel()
            while not pending.empty():
                left = pending.get_nowait()
                if left is not None:
                    left.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _stream_one(self, request: Any, context: Any, metadata: Sequence[tuple[str, Any]]) -> Any:
        """One request of a stream; an error is its answer's ``error_message``, with the message a
        unary call's status would carry."""
        state = RequestState(id=new_request_id())

        async def answer(state: RequestState) -> Any:
            return await self._infer(state, request)

        result, error = await self.calls.run("ModelStreamInfer", context, state, answer, metadata, authorize=False)
        if error is not None:
            # The request's id, as Triton sends it, so a client with several requests in flight
            # can tell which one failed.
            failed = _response("ModelInfer", id=request.id)
            return ModelStreamInferResponse(error_message=public_message(error, state), infer_response=failed)
        return ModelStreamInferResponse(infer_response=result)


def model_config(served: ServedModel) -> Any:
    """What is true of a maskserve model, in the protocol's configuration: texts in, JSON out, one
    instance on its device, dynamic batching within its queue, window and deadline."""
    settings: Settings = served.settings
    config = ModelConfig(
        name=served.name,
        platform=model_metadata_of(served)["platform"],
        backend=settings.backend,
        # 0: the tensors have no batch dimension of the protocol's; texts are batched by the server.
        max_batch_size=0,
    )
    string = 13  # TYPE_STRING: BYTES
    config.input.add(name=INPUT_NAME, data_type=string, dims=[-1])
    for name in OUTPUT_NAMES:
        config.output.add(name=name, data_type=string, dims=[-1])
    config.instance_group.add(name=served.name, count=1, kind=1 if settings.device.startswith("cuda") else 2)
    batching = config.dynamic_batching
    batching.max_queue_delay_microseconds = int(settings.max_batch_delay * 1_000_000)
    batching.default_queue_policy.default_timeout_microseconds = int(settings.request_timeout * 1_000_000)
    batching.default_queue_policy.allow_timeout_override = True
    batching.default_queue_policy.max_queue_size = settings.max_queue
    parameters: dict[str, object] = {
        "max_batch_size": settings.max_batch_size,
        "max_batch_tokens": settings.max_batch_tokens,
    }
    if served.parts is not None:
        parameters |= {"mask_token": served.parts.model.mask_token, "max_tokens": served.parts.model.max_tokens}
    for key, value in parameters.items():
        config.parameters[key].string_value = str(value)
    return config


def add_statistics(stats: Any, name: str, counts: Any) -> None:
    """One model's ``ModelStatistics`` from what the metrics counted (``Metrics.model_statistics``)."""
    stats.name, stats.version = name, MODEL_VERSION
    stats.inference_count, stats.execution_count = counts.texts, counts.batches
    inference = stats.inference_stats
    inference.success.count = counts.succeeded
    inference.fail.count = counts.failed
    inference.queue.count, inference.queue.ns = counts.queued_rows, int(counts.queued_s * 1e9)
    inference.compute_infer.count, inference.compute_infer.ns = counts.batches, int(counts.inference_s * 1e9)
