"""The graph backends side by side, for the tests that hold them to the same behaviour."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from maskserve.engine import FillMaskEngine, load
from maskserve.engine.graph import GraphFillMaskEngine
from maskserve.model_api import ModelSpec, Query
from tests.conftest import HAS_ONNXRUNTIME, HAS_OPENVINO, NO_ONNXRUNTIME, NO_OPENVINO


@dataclass(frozen=True)
class Graph:
    """One graph backend, as its tests see it."""

    backend: str  # --backend, and the engine module's name
    folder: str  # its entries' folder in the cache dir
    model_file: str  # the file an entry's graph is opened from
    weights_file: str  # the file that holds its weights
    extra: str  # the pip extra that installs its runtime
    maker: tuple[str, str]  # (module, function) that makes a new entry's graph, to stop it
    export_module: str  # the module of its graph's export_key
    platform: str  # the Open Inference Protocol's name for it
    session_engine: str  # this session's engine of the tiny BERT on it (a fixture)
    installed: bool
    missing: str  # why its tests are skipped where it is not installed

    @property
    def needed(self) -> pytest.MarkDecorator:
        """Skips a test of this backend where its runtime is not installed."""
        return pytest.mark.skipif(not self.installed, reason=self.missing)

    def load(self, model: str | Path | None, cache_dir: Path, **options: Any) -> GraphFillMaskEngine:
        """A fresh engine through the one loading entry."""
        options.setdefault("threads", 1)
        engine = load(
            ModelSpec(model=None if model is None else str(model), backend=self.backend, cache_dir=cache_dir, **options)
        )
        assert isinstance(engine, GraphFillMaskEngine)
        return engine

    def entries(self, cache_dir: Path) -> list[str]:
        """The cache's entries; temporary and discarded folders (dot-names) excluded."""
        root = cache_dir / self.folder
        return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


ONNXRUNTIME = Graph(
    backend="onnxruntime",
    folder="onnx",
    model_file="model.onnx",
    weights_file="model.onnx",
    extra="onnx",
    maker=("onnx_export", "export_graph"),
    export_module="onnx_export",
    platform="onnxruntime_onnx",
    session_engine="onnx_bert_engine",
    installed=HAS_ONNXRUNTIME,
    missing=NO_ONNXRUNTIME,
)
OPENVINO = Graph(
    backend="openvino",
    folder="openvino",
    model_file="model.xml",
    weights_file="model.bin",
    extra="openvino",
    maker=("openvino", "convert_graph"),
    export_module="openvino_export",
    platform="openvino",
    session_engine="ov_bert_engine",
    installed=HAS_OPENVINO,
    missing=NO_OPENVINO,
)
GRAPHS = [pytest.param(graph, id=graph.backend, marks=graph.needed) for graph in (ONNXRUNTIME, OPENVINO)]


@pytest.fixture(params=GRAPHS)
def graph(request: pytest.FixtureRequest) -> Graph:
    """Each graph backend in turn, skipped where its runtime is not installed."""
    chosen: Graph = request.param
    return chosen


@pytest.fixture
def graph_engine(graph: Graph, request: pytest.FixtureRequest) -> FillMaskEngine:
    """This session's engine of the tiny BERT on ``graph``."""
    engine: FillMaskEngine = request.getfixturevalue(graph.session_engine)
    return engine


def top_answer(engine: FillMaskEngine, text: str = "paris is the [MASK] of france.") -> list[tuple[int, float]]:
    """The engine's five best (token, score) for ``text``."""
    [[predictions]] = engine.predict([Query(engine.encode(text), 5)])
    return [(p["token"], p["score"]) for p in predictions]
