"""engine/loading.py: the one loading entry picks the backend the settings name, with their threads."""

from __future__ import annotations

from pathlib import Path

from maskserve.config.model_configs import model_configs
from maskserve.config.model_settings import model_spec
from maskserve.config.settings import Settings
from maskserve.engine import TorchFillMaskEngine
from maskserve.http.app import load_model
from tests.unit.engine.conftest import Graph


def test_the_settings_choose_a_graph_backend_with_their_threads(
    graph: Graph, bert_dir: Path, export_cache: Path
) -> None:
    settings = Settings(backend=graph.backend, model=(str(bert_dir),), cache_dir=str(export_cache), threads=2)
    engine = load_model(settings)
    assert engine.describe()["backend"] == graph.backend
    assert engine.describe()[f"{graph.backend}_threads"] == 2


def test_the_settings_choose_torch_by_default(bert_dir: Path) -> None:
    engine = load_model(Settings(model=(str(bert_dir),), threads=1))
    assert isinstance(engine, TorchFillMaskEngine) and engine.threads.max_threads == 1


def test_the_spec_carries_every_loading_setting(tmp_path: Path) -> None:
    settings = Settings(
        backend="openvino", model=("m",), cache_dir=str(tmp_path), device="cpu", dtype="bfloat16", threads=0
    )
    spec = model_spec(model_configs(settings)[0])
    assert (spec.model, spec.backend, spec.cache_dir, spec.dtype) == ("m", "openvino", tmp_path, "bfloat16")
    assert (spec.threads, spec.adaptive_threads, spec.quantize) == (settings.resolved_threads(), True, "none")
