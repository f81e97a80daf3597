"""``GET /info``: what is served and how: model, runtime, batching, breaker, limits, versions.

Everything comes from the settings and the model's own ``describe()``: the HTTP side never
imports torch, and nothing here runs the model.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from maskserve import __version__
from maskserve.config.bounds import followed, following
from maskserve.config.settings import Settings
from maskserve.model_api import FillMaskModel, describe_model
from maskserve.request.keys import service_of
from maskserve.service.registry import FillMaskService

Section = dict[str, str | int | float | bool | None]
# A served model's section in the "models" list: its own, with its batching and limits nested.
ModelEntry = dict[str, str | int | float | bool | Section | None]


def model_section(model: FillMaskModel | None, name: str) -> Section | None:
    """The model, by the ``name`` clients use (``--model-name``), and how it runs; fields a model (a
    test double) cannot tell are null."""
    if model is None:
        return None
    description = describe_model(model)
    return {
        "name": name,
        "source": description.get("source", model.name),
        "backend": description.get("backend"),
        "architecture": description.get("architecture"),
        "mask_token": model.mask_token,
        "max_tokens": model.max_tokens,
        "device": description.get("device"),
        "dtype": description.get("dtype"),
        # The precision a pass computes in and on what ("bfloat16 on AMX", "... emulated ..."),
        # and the CPU's matrix units: what to read before choosing --dtype and --backend.
        "precision": description.get("precision"),
        "cpu_matrix_features": description.get("cpu_matrix_features"),
        # With --quantize int8 on openvino: what multiplies int8 here (AMX, VNNI, or AVX2 with the
        # overflow fix) and the recipe the graph was quantized by for it.
        "int8_kernels": description.get("int8_kernels"),
        "int8_recipe": description.get("int8_recipe"),
        # With --dtype bfloat16 on openvino: "float32" where the last layer and the head run in
        # float32 beside a bfloat16 body, "bfloat16" where the graph could not be cut there.
        "last_layer_precision": description.get("last_layer_precision"),
        "torch_threads": description.get("torch_threads"),
        "mask_only_head": description.get("mask_only_head"),
        # Whether the last encoder layer runs at the rows the head reads only, on every backend:
        # "yes", or "no: " and why not (another layout, a precision or graph its probe refused).
        "read_rows_last_layer": description.get("read_rows_last_layer"),
        # The onnxruntime and openvino backends' own (null on torch): threads, and the graph run.
        "onnxruntime_threads": description.get("onnxruntime_threads"),
        "openvino_threads": description.get("openvino_threads"),
        "export_cache_key": description.get("export_cache_key"),
        "export_path": description.get("export_path"),
        "load_seconds": description.get("load_seconds"),
    }


def batching_section(settings: Settings) -> Section:
    return {
        "max_batch_size": settings.max_batch_size,
        "max_batch_tokens": settings.max_batch_tokens,
        "max_batch_delay_s": settings.max_batch_delay,
    }


def limits_section(settings: Settings) -> Section:
    return {
        "max_body_bytes": settings.max_body_bytes,
        "max_text_chars": settings.max_text_chars,
        "max_text_tokens": settings.max_text_tokens,
        "max_inputs": settings.max_inputs,
        "max_top_k": settings.max_top_k,
        "max_targets": settings.max_targets,
        "default_top_k": settings.default_top_k,
        "max_masks_per_text": settings.max_masks_per_text,
        "max_predictions": settings.max_predictions,
        "max_score_tokens": settings.max_score_tokens,
        "max_word_copies": settings.max_word_copies,
        "max_response_bytes": settings.max_response_bytes,
    }


def model_limits_section(settings: Settings, model: FillMaskModel | None) -> Section:
    """The limits, and what they come to on this model: the most masks its longest text may hold."""
    section = limits_section(settings)
    if model is not None:
        section["max_masks_per_longest_text"] = settings.masks_allowed(settings.max_text_tokens, model.max_tokens)
    return section


def followed_section(settings: Settings) -> Section:
    """Each limit the user left alone whose default moved to fit one they set, and that setting."""
    return {name: other for name, other in followed(settings).items()}


def models_list(served: Sequence[tuple[str, Settings, FillMaskModel | None]]) -> list[ModelEntry]:
    """Every served model by name, the default first: how it runs, its queue bound, its batching and limits."""
    entries: list[ModelEntry] = []
    for name, settings, model in served:
        section = model_section(model, name) or {"name": name}
        entry: ModelEntry = {**section, "quantize": settings.quantize, "max_queue": settings.max_queue}
        entry["batching"] = batching_section(settings)
        entry["limits"] = model_limits_section(settings, model)
        entry["defaults_follow"] = dict(following(settings))
        entry["defaults_followed"] = followed_section(settings)
        entries.append(entry)
    return entries


def server_info(
    settings: Settings,
    model: FillMaskModel | None,
    middleware: tuple[str, ...] = (),
    served: Sequence[tuple[str, Settings, FillMaskModel | None]] | None = None,
) -> dict[str, Section | list[str] | list[ModelEntry] | None]:
    """The server's description; ``model`` is the default model, ``served`` every model (name,
    settings, engine once loaded), the default alone when not given."""
    description = describe_model(model) if model is not None else {}
    default = model_section(model, settings.model_name if not served else served[0][0])
    if default is not None:
        default["quantize"] = settings.quantize
    return {
        # The default model, which POST / serves (every model is in "models").
        "model": default,
        "models": models_list(served or [(settings.model_name, settings, model)]),
        # The active middleware stages, outermost first (auth and cors only when configured).
        "middleware": list(middleware),
        # Where else the same models are served: the Open Inference Protocol over gRPC (None: off).
        "grpc": {"port": settings.grpc_port or None, "service": "inference.GRPCInferenceService"},
        "batching": batching_section(settings),
        "breaker": {
            "max_queue": settings.max_queue,
            "request_timeout_s": settings.request_timeout,
            "drain_delay_s": settings.drain_delay,
            "drain_timeout_s": settings.drain_timeout,
            "stall_timeout_s": settings.stall_timeout,
        },
        # What a client connection may take and hold (serving/connection_guard.py).
        "connections": {
            "header_timeout_s": settings.header_timeout,
            "body_timeout_s": settings.body_timeout,
            "write_timeout_s": settings.write_timeout,
            "keepalive_timeout_s": settings.keepalive_timeout,
            "max_connections": settings.max_connections,
            "max_unsent_bytes": settings.max_unsent_bytes,
        },
        "limits": model_limits_section(settings, model),
        # How each default the user left alone follows another limit, or the text's length
        # ({"max_score_tokens": "max_text_tokens", ...}).
        "defaults_follow": dict(following(settings)),
        # Each limit the user left alone whose default moved to fit one they set, and that setting
        # (--max-queue 8: {"max_inputs": "max_queue", ...}); the values are in the sections above.
        "defaults_followed": followed_section(settings),
        "versions": {
            "maskserve": __version__,
            "torch": description.get("torch_version"),
            "transformers": description.get("transformers_version"),
            "onnxruntime": description.get("onnxruntime_version"),
            "openvino": description.get("openvino_version"),
            "aiohttp": aiohttp.__version__,
            "python": platform.python_version(),
        },
    }


def repository_section(service: FillMaskService) -> dict[str, Any] | None:
    """How models come and go (--model-control-mode), the memory budget, and every model the
    server may serve with its state and its measured memory."""
    control = service.control
    if control is None:
        return None
    return {
        "control_mode": control.mode,
        "repository": service.settings.model_repository,
        "models_memory_bytes": control.budget_bytes,
        "models": {
            entry.name: {"state": entry.state, "reason": entry.reason, "memory_bytes": entry.memory_bytes}
            for entry in control.index()
        },
    }


async def info(request: web.Request) -> web.Response:
    """``GET /info``: the served models and the server's configuration, as JSON."""
    service = service_of(request.app)
    served = [(m.name, m.settings, m.parts.model if m.parts is not None else None) for m in service.models.values()]
    default = service.default
    document: dict[str, Any] = dict(
        server_info(default.settings, default.parts.model if default.parts else None, service.middleware, served)
    )
    document["model_repository"] = repository_section(service)
    return web.json_response(document)
