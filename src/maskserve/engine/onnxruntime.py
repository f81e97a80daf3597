"""The onnxruntime backend: the encoder and the mask-only head run by ONNX Runtime on the CPU.

Loading is every graph backend's (``graph.py``): the graph of ``onnx_export.py`` is taken from the
cache or exported, and checked against torch on a probe batch before anything is served; only the
session (and the tokenizer) stay in memory. Tokenization, targets, top-k and the answer's shape
are the shared :class:`base.FillMaskEngine`'s; this module only opens and runs the graph.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from maskserve.engine import onnx_export
from maskserve.engine.export_cache import CachedExport, ExportFailed, ExportRecipe, one_line, open_or_make
from maskserve.engine.graph import GraphFillMaskEngine, GraphLoad, require_cpu, with_read_rows
from maskserve.engine.onnx_export import MODEL_FILE, OUTPUT, export_key
from maskserve.engine.pretrained import BackendUnavailable
from maskserve.model_api import ModelSpec

log = logging.getLogger(__name__)

# The exported graph must give torch's scores within this on the probe (the fidelity bound).
PROBE_SCORE_TOLERANCE = 1e-4


def _onnxruntime() -> Any:
    try:
        import onnx  # noqa: F401 - the export needs it; checked here to fail before loading
        import onnxruntime
    except ImportError as exc:
        raise BackendUnavailable(
            f"--backend onnxruntime needs onnxruntime and onnx ({one_line(exc)}): pip install 'maskserve[onnx]'"
        ) from exc
    return onnxruntime


def open_session(model_file: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session on ``threads`` intra-op threads that sleep when idle.

    One session, a fixed thread count: ORT fixes its pool when the session opens. Its threads
    spin by default, which costs a busy neighbour (the event loop, torch's own threads) its core;
    with spinning off, every allowed core helps at every batch size, on the default model and on
    bert-base's shape alike, so no second 1-thread session is kept (it would hold a second copy of
    the weights). Where other jobs hold the cores anyway, ``--torch-threads 1`` loses nothing and
    may serve more (the benchmark's backend runs, ``python -m benchmarks.run``, measure it).
    """
    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: its warnings are about nodes left on the CPU
    try:
        return ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail, InvalidGraph, ... classes
        raise ExportFailed(f"ONNX Runtime cannot load {model_file}: {one_line(exc)}") from exc


def run_graph(session: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    (logits,) = session.run([OUTPUT], inputs)
    result: np.ndarray = logits
    return result


class OnnxFillMaskEngine(GraphFillMaskEngine):
    """The onnxruntime backend: one fused graph on the CPU, float32, a fixed intra-op thread count."""

    backend = "onnxruntime"
    thread_policy = "fixed, onnxruntime threads sleep when idle"

    def __init__(self, load: GraphLoad, export: CachedExport, session: Any) -> None:
        super().__init__(load, export, dtype="float32")
        self.session = session

    def _run_graph(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return run_graph(self.session, inputs)

    def _describe_graph(self) -> dict[str, str | int | float]:
        fused = self.export.meta.get("fused_operators", {})
        return {"fused_operators": ", ".join(f"{name} {count}" for name, count in sorted(fused.items())) or "none"}


def load_onnx_engine(spec: ModelSpec) -> OnnxFillMaskEngine:
    """``spec``'s model with its fused graph, reused or made under its cache folder's ``onnx/``, checked."""
    started = time.perf_counter()
    dtype, threads = spec.dtype, spec.threads
    require_cpu("onnxruntime", spec.device)
    if dtype not in ("auto", "float32"):
        # bfloat16 on the CPU is the openvino and torch backends' (docs: Backends and precision).
        other = "--backend openvino or --backend torch" if dtype == "bfloat16" else "--backend torch"
        raise BackendUnavailable(f"--backend onnxruntime runs float32 only, not --dtype {dtype}; use {other} for it")
    if spec.quantize != "none":
        raise BackendUnavailable(f"--quantize {spec.quantize} runs on --backend torch only")
    _onnxruntime()
    # Eager attention: it is what ONNX Runtime's attention fusion recognises in the traced graph.
    load = GraphLoad.begin(
        "onnxruntime",
        spec.model,
        started=started,
        root=spec.cache_dir / "onnx",
        threads=threads,
        precision="float32",
        attn_implementation="eager",
    )

    def open_checked(model_file: Path) -> Any:
        session = open_session(model_file, threads)
        load.probe.check(lambda inputs: run_graph(session, inputs), PROBE_SCORE_TOLERANCE)
        return session

    def make(read_rows: bool) -> tuple[CachedExport, Any]:
        key, parts = export_key(load.loaded.model, read_rows)
        return open_or_make(
            ExportRecipe(
                load.loaded.model,
                load.root,
                key,
                parts,
                open_checked,
                build=functools.partial(onnx_export.export_graph, read_rows=read_rows),
                model_name=MODEL_FILE,
                what="ONNX",
            ),
            making=f"exporting {load.loaded.name} to ONNX",
        )

    export, session, read_rows = with_read_rows(load, make)
    if not export.reused:
        log.info(
            "exported in %.1fs + fused in %.1fs: %s",
            export.meta["export_seconds"],
            export.meta["fusion_seconds"],
            export.meta["fused_operators"],
        )
    return load.finish(OnnxFillMaskEngine(load, export, session), "onnxruntime", "export", read_rows)
