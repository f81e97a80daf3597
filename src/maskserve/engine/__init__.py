"""The engine: model loading and batched fill-mask inference. Imports no aiohttp: it knows
nothing of HTTP.

An engine reproduces ``transformers.pipeline("fill-mask")`` answer for answer (same tokens, same
order, scores within float noise), but runs the masked-LM head only at mask positions and takes
already tokenized, length-varied batches. It implements ``model_api.FillMaskModel``.

    base.py         what every backend shares: FillMaskEngine (tokens, targets, top-k,
                    sequences, describe), padding, the probe texts
    pretrained.py   a model and tokenizer loaded and checked, device and dtype, the refusals
    threads.py      the thread policy: every allowed core, or one for a small model's small batch
    torch.py        the torch backend (--backend torch): any device, dtype, --quantize
    graph.py        what the graph backends share: the engine around a graph, the loading skeleton
    export_cache.py the graphs' content-keyed disk cache: keys, atomic entries, checks
    onnxruntime.py  the onnxruntime backend (maskserve[onnx]): the graph run by ONNX Runtime
    onnx_export.py  that graph (the mask positions it takes), its ONNX export and fusion
    openvino.py     the openvino backend (maskserve[openvino]): the graph run by OpenVINO, f32 or bf16
    openvino_export.py  that graph: convert_model of the same module, cached like the ONNX export
    openvino_quantize.py  that graph quantized to int8 by NNCF (--quantize int8), cached beside it
    loading.py      load(spec): the one loading entry, which picks the backend
    probe.py        the check every exported graph passes against torch before it is served
    cpu.py          the CPU's matrix features and the precision in effect (no torch)

:func:`load` is the one loading entry: a :class:`~maskserve.model_api.ModelSpec` in, the engine it
names out. Importing this package imports torch, and none of onnx, onnxruntime, openvino or nncf:
those backends are imported by name, only when asked for.
"""

from __future__ import annotations

from maskserve.config.model_source import ModelLoadError
from maskserve.engine.base import FillMaskEngine
from maskserve.engine.loading import load
from maskserve.engine.pretrained import (
    DEFAULT_MODEL_PACKAGE,
    BackendUnavailable,
    default_model_dir,
    resolve_device,
    resolve_dtype,
)
from maskserve.engine.threads import (
    PARALLEL_MIN_FLOPS,
    PARALLEL_MIN_FLOPS_PER_TOKEN,
    ThreadPolicy,
    encoder_flops_per_token,
)
from maskserve.engine.torch import TorchFillMaskEngine, load_engine, quantize_int8

__all__ = [
    "DEFAULT_MODEL_PACKAGE",
    "PARALLEL_MIN_FLOPS",
    "PARALLEL_MIN_FLOPS_PER_TOKEN",
    "BackendUnavailable",
    "FillMaskEngine",
    "ModelLoadError",
    "ThreadPolicy",
    "TorchFillMaskEngine",
    "default_model_dir",
    "encoder_flops_per_token",
    "load",
    "load_engine",
    "quantize_int8",
    "resolve_device",
    "resolve_dtype",
]
