"""The one loading entry: a :class:`~maskserve.model_api.ModelSpec` in, its backend's engine out.

A second model is a second call. The graph backends are imported here by name, only when asked
for, so importing the engine imports none of their runtimes.
"""

from __future__ import annotations

from maskserve.engine.base import FillMaskEngine
from maskserve.engine.torch import load_engine
from maskserve.model_api import ModelSpec


def load(spec: ModelSpec) -> FillMaskEngine:
    """Load the model ``spec`` names on its backend, with its device, precision and threads.

    Raises :class:`~maskserve.engine.ModelLoadError` for a model no backend can serve (exit 1),
    and :class:`~maskserve.engine.BackendUnavailable` (exit 2) when its backend cannot serve it
    as asked.
    """
    if spec.backend == "onnxruntime":
        from maskserve.engine.onnxruntime import load_onnx_engine

        return load_onnx_engine(spec)
    if spec.backend == "openvino":
        from maskserve.engine.openvino import load_openvino_engine

        return load_openvino_engine(spec)
    return load_engine(
        spec.model,
        device=spec.device,
        dtype=spec.dtype,
        threads=spec.threads,
        adaptive_threads=spec.adaptive_threads,
        quantize=spec.quantize,
    )
