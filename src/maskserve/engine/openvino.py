"""The openvino backend: the encoder and the mask-only head run by OpenVINO's CPU plugin.

Loading is every graph backend's (``graph.py``): the graph of ``openvino_export.py`` is taken from
the cache or converted, compiled in the precision asked for, and checked against torch on a probe
batch before anything is served. Tokenization, targets, top-k and the answer's shape are the shared
:class:`base.FillMaskEngine`'s; this module only compiles and runs the graph.

float32 is set explicitly: OpenVINO's own default on a CPU with AMX is bfloat16, which would
change the answers without the operator asking. ``--dtype bfloat16`` compiles the same graph in
bfloat16, where the CPU runs it natively (AMX or AVX-512 BF16), with its last layer and head in
float32 (``openvino_split.py``); elsewhere it is refused.
``--quantize int8`` serves the graph of ``openvino_quantize.py`` instead: int8 encoder, float32
head and last layer at the read rows.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from maskserve.engine.cpu import (
    describe_features,
    int8_fast,
    int8_in_effect,
    int8_kernels,
    native_bf16,
    precision_in_effect,
)
from maskserve.engine.export_cache import (
    CachedExport,
    ExportFailed,
    ExportRecipe,
    export_to_cache,
    one_line,
    open_cached,
    open_or_make,
)
from maskserve.engine.graph import GraphFillMaskEngine, GraphLoad, require_cpu, with_read_rows
from maskserve.engine.openvino_export import COMPILED_DIR, MODEL_FILE, convert_graph, export_key
from maskserve.engine.openvino_quantize import Int8Recipe, quantize_graph, quantized_key, recipe_for
from maskserve.engine.openvino_split import SplitCompiled, cut_before_last_layer
from maskserve.engine.pretrained import BackendUnavailable
from maskserve.model_api import ModelSpec

log = logging.getLogger(__name__)

# --dtype -> OpenVINO's inference precision. float16 is left out: the CPU plugin runs it only on
# the few CPUs with AVX-512 FP16 or AMX-FP16, and torch on CUDA is the place for it.
PRECISIONS = {"auto": "f32", "float32": "f32", "bfloat16": "bf16"}
DTYPES = {"f32": "float32", "bf16": "bfloat16"}
# A graph must give torch float32's scores within this on the probe: the fidelity bound for
# float32, and for bfloat16 the bound its fidelity test holds the default model to.
PROBE_SCORE_TOLERANCE = {"f32": 1e-4, "bf16": 0.02}
# int8 moves scores further than bfloat16 does, most on the probe's short texts of a small model:
# here the probe only has to tell a right graph, a little off, from a broken one, whose scores
# would be unrelated to torch's. int8's agreement is measured by benchmarks/agreement.py.
INT8_PROBE_SCORE_TOLERANCE = 0.25


# The graph's shapes are dynamic: the CPU plugin prepares kernels and buffers for each (batch,
# length) it meets and keeps them in a cache, megabytes per shape on a bert-base-sized graph (most
# in int8). Its own default keeps thousands, and served texts of varied lengths make thousands of
# shapes: resident memory would grow by gigabytes. Bounded here; a shape that fell out is prepared
# again, which costs little beside a forward pass (benchmarks/memory_soak.py measures both).
RUNTIME_CACHE_SHAPES = 64


def _require_nncf() -> None:
    import importlib.util

    if importlib.util.find_spec("nncf") is None:
        raise BackendUnavailable(
            "--backend openvino --quantize int8 needs nncf (OpenVINO's quantizer): "
            "pip install 'maskserve[openvino-int8]'"
        )


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise BackendUnavailable(
            f"--backend openvino needs openvino ({one_line(exc)}): pip install 'maskserve[openvino]'"
        ) from exc
    return openvino


@functools.cache
def shared_core() -> Any:
    """The process's one OpenVINO Core, kept until exit.

    Each Core starts its own CPU plugin, and the plugin swaps the signal stack of the thread that
    starts it, restoring the previous one when it ends. Plugins that end in another order than
    they started leave a freed signal stack in place, and the next signal (SIGTERM, for a drain)
    crashes the process. One Core, never released, starts the plugin once.
    """
    return _openvino().Core()


def compile_graph(model_file: Path, precision: str, threads: int, *, keep_compiled: bool = True) -> Any:
    """``model_file`` compiled for this CPU in ``precision`` on ``threads`` threads, one stream.

    One stream with the latency hint: maskserve runs one batch at a time, so all the threads go
    to that batch. With ``keep_compiled``, the compiled model is kept in the entry's ``compiled/``
    folder by OpenVINO. The plugin's cache of per-shape kernels is bounded
    (:data:`RUNTIME_CACHE_SHAPES`).
    """
    with _compiling(model_file):
        core = shared_core()
        return core.compile_model(
            core.read_model(str(model_file)), "CPU", _compile_config(model_file, precision, threads, keep_compiled)
        )


def compile_bfloat16(model_file: Path, threads: int, *, keep_compiled: bool = True) -> Any:
    """``model_file`` in bfloat16 with its last encoder layer and head in float32
    (``openvino_split.py``), or whole in bfloat16 where the graph cannot be cut there."""
    with _compiling(model_file):
        core = shared_core()
        parts = cut_before_last_layer(core.read_model(str(model_file)))
        if parts is not None:
            body = core.compile_model(parts.body, "CPU", _compile_config(model_file, "bf16", threads, keep_compiled))
            tail = core.compile_model(parts.tail, "CPU", _compile_config(model_file, "f32", threads, keep_compiled))
            return SplitCompiled(body, tail)
    log.warning("%s cannot be cut before its last layer: all of it runs in bfloat16", model_file)
    return compile_graph(model_file, "bf16", threads, keep_compiled=keep_compiled)


@contextlib.contextmanager
def _compiling(model_file: Path) -> Iterator[None]:
    """OpenVINO's errors while reading or compiling ``model_file``, as one ``ExportFailed`` line."""
    try:
        yield
    except Exception as exc:  # OpenVINO raises RuntimeError with a long multi-line message
        raise ExportFailed(f"OpenVINO cannot compile {model_file}: {one_line(exc)}") from exc


def _compile_config(model_file: Path, precision: str, threads: int, keep_compiled: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": precision,
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_SHAPES,
    }
    if keep_compiled:
        config["CACHE_DIR"] = str(model_file.parent / COMPILED_DIR)
    return config


def precision_of(compiled: Any) -> str:
    """The inference precision OpenVINO settled on ('f32', 'bf16'), which may differ from the hint."""
    value = compiled.get_property("INFERENCE_PRECISION_HINT")
    return str(value.to_string() if hasattr(value, "to_string") else value)


def run_graph(request: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    result = request.infer(inputs)
    logits: np.ndarray = result[0]
    return logits


class OpenVinoFillMaskEngine(GraphFillMaskEngine):
    """The openvino backend: one graph on the CPU, float32 or bfloat16, a fixed thread count."""

    backend = "openvino"
    thread_policy = "fixed, one OpenVINO stream"

    def __init__(
        self, load: GraphLoad, export: CachedExport, compiled: Any, *, precision: str, quantize: str = "none"
    ) -> None:
        super().__init__(load, export, dtype=DTYPES[precision])
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.quantize = quantize

    def _run_graph(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return run_graph(self.request, inputs)

    def _describe_graph(self) -> dict[str, str | int | float]:
        if self.dtype == "bfloat16":
            split = isinstance(self.compiled, SplitCompiled)
            return {"last_layer_precision": "float32" if split else "bfloat16"}
        if self.quantize != "int8":
            return {}
        return {
            "precision": int8_in_effect(),
            "int8_kernels": int8_kernels() if int8_fast() else "AVX2, with the overflow fix",
            "int8_recipe": str(self.export.meta["parts"]["recipe"]["name"]),
        }


def _not_on_this_cpu(got: str, precision: str) -> BackendUnavailable:
    return BackendUnavailable(
        f"OpenVINO runs this graph in {got}, not {precision}, on this CPU (matrix features: "
        f"{describe_features()}); bfloat16 needs AMX or AVX-512 BF16, else use --dtype float32 "
        "or --backend torch (which emulates bfloat16, slower than float32)"
    )


def _precision_for(dtype: str) -> str:
    precision = PRECISIONS.get(dtype)
    if precision is None:
        raise BackendUnavailable(
            f"--backend openvino runs float32 or bfloat16, not --dtype {dtype}; use --backend torch for it"
        )
    return precision


def _check_quantize(quantize: str, precision: str, dtype: str) -> None:
    if quantize == "int8":
        if precision != "f32":
            raise BackendUnavailable(
                f"--backend openvino --quantize int8 runs with --dtype float32 (the default), not --dtype {dtype}: "
                "its int8 graph keeps the head in float32"
            )
        _require_nncf()
    elif quantize != "none":
        raise BackendUnavailable(f"--backend openvino runs --quantize int8 or none, not {quantize}")


class _Graphs:
    """Where a load finds or makes its graph: the float32 one, or the int8 one made from it."""

    def __init__(
        self, load: GraphLoad, precision: str, int8_recipe: Int8Recipe | None = None, *, read_rows: bool
    ) -> None:
        self.load = load
        self.precision = precision
        self.int8_recipe = int8_recipe
        self.read_rows = read_rows
        self.key, self.parts = export_key(load.loaded.model, read_rows)

    def open_checked(self, model_file: Path, tolerance: float | None = None, keep_compiled: bool = True) -> Any:
        """The graph compiled in the precision asked for, and checked against torch."""
        precision = self.precision
        if precision == "bf16":
            compiled = compile_bfloat16(model_file, self.load.threads, keep_compiled=keep_compiled)
        else:
            compiled = compile_graph(model_file, precision, self.load.threads, keep_compiled=keep_compiled)
        got = precision_of(compiled)
        if got != precision:
            raise _not_on_this_cpu(got, precision)
        request = compiled.create_infer_request()
        bound = PROBE_SCORE_TOLERANCE[precision] if tolerance is None else tolerance
        self.load.probe.check(lambda inputs: run_graph(request, inputs), bound)
        return compiled

    def open_int8(self, model_file: Path) -> Any:
        # Compiled from the graph at every start (a second or two), never restored from
        # OpenVINO's compiled cache: OpenVINO 2025.1, inside this extra's bounds, restored an
        # int8 graph from it that answered every token alike, and the loose probe let that by.
        return self.open_checked(model_file, INT8_PROBE_SCORE_TOLERANCE, keep_compiled=False)

    def float32(self) -> tuple[CachedExport, Any]:
        loaded = self.load.loaded
        made = open_or_make(
            ExportRecipe(
                loaded.model,
                self.load.root,
                self.key,
                self.parts,
                self.open_checked,
                build=functools.partial(convert_graph, read_rows=self.read_rows),
                model_name=MODEL_FILE,
                what="OpenVINO",
            ),
            making=f"converting {loaded.name} to OpenVINO",
        )
        if not made[0].reused:
            log.info("converted in %.1fs", made[0].meta["convert_seconds"])
        return made

    def int8(self) -> tuple[CachedExport, Any]:
        loaded, root = self.load.loaded, self.load.root
        recipe = self.int8_recipe or recipe_for()
        int8_key, int8_parts = quantized_key(self.parts, recipe)
        cached = open_cached(root, int8_key, self.open_int8, MODEL_FILE)
        if cached is not None:
            return cached
        # Read after the float32 graph is compiled: the shared Core starts before NNCF's own.
        float32_export = self.float32()[0]
        float32 = shared_core().read_model(str(float32_export.model_file))
        log.info("quantizing %s to int8 with NNCF (once per model and versions; cache key %s)", loaded.name, int8_key)

        def build(_model: Any, folder: Path) -> dict[str, Any]:
            done = quantize_graph(float32, folder, loaded.tokenizer, recipe)
            return {
                **done,
                "mask_only_head": float32_export.meta.get("mask_only_head"),
                "read_rows_last_layer": self.read_rows,
            }

        made = export_to_cache(
            ExportRecipe(
                loaded.model,
                root,
                int8_key,
                int8_parts,
                self.open_int8,
                build=build,
                model_name=MODEL_FILE,
                what="OpenVINO int8",
            )
        )
        log.info("quantized in %.1fs", made[0].meta["quantize_seconds"])
        return made


def load_openvino_engine(spec: ModelSpec, *, int8_recipe: Int8Recipe | None = None) -> OpenVinoFillMaskEngine:
    """``spec``'s model with its graph, reused or made under its cache folder's ``openvino/``,
    compiled in the precision asked for and checked.

    ``int8_recipe`` overrides the recipe chosen for this CPU (tests and benchmarks compare them).
    """
    started = time.perf_counter()
    quantize = spec.quantize
    require_cpu("openvino", spec.device)
    precision = _precision_for(spec.dtype)
    # Settings that contradict each other are refused as such on every CPU, before what this
    # CPU lacks.
    _check_quantize(quantize, precision, spec.dtype)
    if precision == "bf16" and not native_bf16():
        # Refused before anything is loaded: without AMX or AVX-512 BF16 the CPU plugin either
        # fails to compile a bfloat16 graph, with a message that names neither, or runs float32.
        raise _not_on_this_cpu("f32", precision)
    _openvino()
    shown = int8_in_effect() if quantize == "int8" else precision_in_effect(DTYPES[precision], "cpu")
    if quantize == "int8" and not int8_fast():
        # Served all the same: the operator asked for it, and it still answers closely.
        log.warning("--quantize int8 on a CPU without VNNI or AMX: %s", int8_in_effect())
    root = spec.cache_dir / "openvino"
    load = GraphLoad.begin("openvino", spec.model, started=started, root=root, threads=spec.threads, precision=shown)

    def make(read_rows: bool) -> tuple[CachedExport, Any]:
        graphs = _Graphs(load, precision, int8_recipe, read_rows=read_rows)
        return graphs.int8() if quantize == "int8" else graphs.float32()

    export, compiled, read_rows = with_read_rows(load, make)
    engine = OpenVinoFillMaskEngine(load, export, compiled, precision=precision, quantize=quantize)
    return load.finish(engine, f"openvino {engine.describe()['precision']}", "graph", read_rows)
