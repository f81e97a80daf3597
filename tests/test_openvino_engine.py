"""The openvino backend: what it refuses, its precision, its cache, and that it checks its graph.

Its float32 answers are held to the pipeline's by tests/test_fidelity.py and tests/test_engine.py,
which run on every backend; its bfloat16 agreement by tests/test_bfloat16.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from maskserve.app import load_model
from maskserve.engine import BackendUnavailable, FillMaskEngine
from maskserve.engine.cpu import describe_features, native_bf16
from maskserve.model_api import ModelSpec, Query
from maskserve.settings import Settings

from .conftest import HAS_OPENVINO, NO_OPENVINO, ClientFactory
from .models import build_bert

pytestmark = pytest.mark.skipif(not HAS_OPENVINO, reason=NO_OPENVINO)

if HAS_OPENVINO:
    from maskserve.engine import graph as graph_engine
    from maskserve.engine import openvino as ov_engine
    from maskserve.engine import openvino_export
    from maskserve.engine.export_cache import ExportFailed
    from maskserve.engine.openvino import OpenVinoFillMaskEngine, load_openvino_engine

NO_NATIVE_BF16 = "this CPU has no AMX or AVX-512 BF16: OpenVINO refuses bfloat16 here"


def entries(cache: Path) -> list[str]:
    """The cache's entries; temporary and discarded folders (dot-names) excluded."""
    root = cache / "openvino"
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


def top_answer(engine: FillMaskEngine, text: str = "paris is the [MASK] of france.") -> list[tuple[int, float]]:
    [[predictions]] = engine.predict([Query(engine.encode(text), 5)])
    return [(p["token"], p["score"]) for p in predictions]


@pytest.fixture(scope="module")
def fresh_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model of this module's own, so that its cache tests never touch the session's cache."""
    return build_bert(tmp_path_factory.mktemp("ov-bert"))


def test_describes_its_backend_threads_precision_and_graph(ov_bert_engine: FillMaskEngine) -> None:
    described = ov_bert_engine.describe()
    assert described["backend"] == "openvino"
    assert (described["device"], described["dtype"], described["precision"]) == ("cpu", "float32", "float32")
    assert described["openvino_threads"] == 1 and described["torch_threads"] == 1
    assert described["mask_only_head"] == "yes"
    assert described["cpu_matrix_features"] == describe_features()
    path = Path(str(described["export_path"]))
    assert path.is_file() and path.name == "model.xml" and path.parent.name == described["export_cache_key"]
    assert (path.parent / "model.bin").is_file()
    assert any((path.parent / openvino_export.COMPILED_DIR).iterdir())  # OpenVINO's compiled model


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ({"device": "cuda"}, "--device cuda"),
        ({"dtype": "float16"}, "--dtype float16"),
    ],
)
def test_what_it_cannot_run_is_refused_naming_the_setting(
    option: dict[str, str], named: str, bert_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(BackendUnavailable, match=named) as caught:
        load_openvino_engine(ModelSpec(model=str(bert_dir), backend="openvino", cache_dir=tmp_path, **option))
    assert "--backend torch" in str(caught.value)
    assert not (tmp_path / "openvino").exists()  # refused before anything is converted


def test_without_openvino_it_says_what_to_install(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    with pytest.raises(BackendUnavailable, match=r"pip install 'maskserve\[openvino\]'"):
        load_openvino_engine(ModelSpec(model=str(bert_dir), backend="openvino", cache_dir=tmp_path))


def test_a_graph_that_disagrees_with_torch_is_refused_and_not_cached(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ov_engine.run_graph

    def off_by_a_little(*args: object) -> np.ndarray:
        logits = real(*args).copy()  # type: ignore[arg-type]
        logits[:, 7] += 0.5
        return logits

    monkeypatch.setattr(ov_engine, "run_graph", off_by_a_little)
    with pytest.raises(ExportFailed, match="differ from torch's"):
        load_openvino_engine(ModelSpec(model=str(bert_dir), backend="openvino", cache_dir=tmp_path))
    assert entries(tmp_path) == []


def test_second_load_reuses_the_cached_graph_without_converting(
    fresh_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_openvino_engine(ModelSpec(model=str(fresh_bert), backend="openvino", cache_dir=tmp_path, threads=1))
    assert not first.export.reused and entries(tmp_path) == [first.export.key]
    written = first.export.model_file.stat().st_mtime_ns

    def no_conversion(*args: object) -> None:
        raise AssertionError("converted again although the cache holds this model")

    monkeypatch.setattr(ov_engine, "convert_graph", no_conversion)
    second = load_openvino_engine(ModelSpec(model=str(fresh_bert), backend="openvino", cache_dir=tmp_path, threads=1))
    assert second.export.reused and second.export.key == first.export.key
    assert second.export.model_file.stat().st_mtime_ns == written
    assert top_answer(second) == top_answer(first)


def test_a_corrupt_cached_graph_is_converted_again(fresh_bert: Path, tmp_path: Path) -> None:
    first = load_openvino_engine(ModelSpec(model=str(fresh_bert), backend="openvino", cache_dir=tmp_path, threads=1))
    weights = first.export.folder / "model.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    # A new file in its place, not a rewrite: the first engine maps the old one, and rewriting a
    # mapped file in place would pull its weights from under it.
    (first.export.folder / "corrupt.bin").write_bytes(bytes(data))
    (first.export.folder / "corrupt.bin").replace(weights)
    again = load_openvino_engine(ModelSpec(model=str(fresh_bert), backend="openvino", cache_dir=tmp_path, threads=1))
    assert not again.export.reused and entries(tmp_path) == [first.export.key]
    assert [token for token, _ in top_answer(again)] == [token for token, _ in top_answer(first)]


def test_the_key_follows_the_weights_and_differs_from_the_onnx_key(fresh_bert: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForMaskedLM

    from maskserve.engine.export_cache import key_of

    model = AutoModelForMaskedLM.from_pretrained(str(fresh_bert))
    key, parts = openvino_export.export_key(model)
    assert parts["openvino"] and parts["weights_sha256"]
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0
    assert openvino_export.export_key(model)[0] != key
    assert key_of({**parts, "backend": "onnxruntime"}) != key


def test_torch_keeps_one_thread_beside_openvino(ov_bert_engine: FillMaskEngine) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # as a torch engine in the same process may have left it
        ov_bert_engine.predict([Query(ov_bert_engine.encode("the [MASK] is red."), 1)])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not native_bf16(), reason=NO_NATIVE_BF16)
def test_bfloat16_compiles_the_same_graph_and_says_what_runs_it(ov_bert_engine: FillMaskEngine) -> None:
    cache = ov_bert_engine.export.folder.parent.parent  # type: ignore[attr-defined]
    engine = load_openvino_engine(
        ModelSpec(model=str(ov_bert_engine.source), backend="openvino", cache_dir=cache, threads=1, dtype="bfloat16")
    )
    assert isinstance(engine, OpenVinoFillMaskEngine) and engine.export.reused  # one graph, two precisions
    assert engine.dtype == "bfloat16"
    assert ov_engine.precision_of(engine.compiled) == "bf16"
    assert engine.describe()["precision"] in ("bfloat16 on AMX", "bfloat16 on AVX-512 BF16")


@pytest.mark.skipif(not native_bf16(), reason=NO_NATIVE_BF16)
def test_bfloat16_that_openvino_would_not_run_is_refused(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CPU whose flags promise bfloat16 but whose plugin settles on float32 all the same.
    monkeypatch.setattr(ov_engine, "precision_of", lambda compiled: "f32")
    with pytest.raises(BackendUnavailable, match="needs AMX or AVX-512 BF16") as caught:
        load_openvino_engine(ModelSpec(model=str(bert_dir), backend="openvino", cache_dir=tmp_path, dtype="bfloat16"))
    assert "--backend torch" in str(caught.value)


def test_bfloat16_on_a_cpu_without_it_is_refused_before_loading(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This CPU's own case where it has neither AMX nor AVX-512 BF16; forced where it has them.
    monkeypatch.setattr(ov_engine, "native_bf16", lambda: False)
    monkeypatch.setattr(graph_engine, "load_pretrained", lambda *a, **k: pytest.fail("loaded the model"))
    with pytest.raises(BackendUnavailable, match=r"needs AMX or AVX-512 BF16.*--backend torch"):
        load_openvino_engine(ModelSpec(model=str(bert_dir), backend="openvino", cache_dir=tmp_path, dtype="bfloat16"))


def test_the_plugins_per_shape_cache_is_bounded(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = ov_engine.shared_core()
    configs: list[dict[str, object]] = []

    class Recording:
        def read_model(self, path: str) -> object:
            return core.read_model(path)

        def compile_model(self, model: object, device: str, config: dict[str, object]) -> object:
            configs.append(config)
            return core.compile_model(model, device, config)

    monkeypatch.setattr(ov_engine, "shared_core", Recording)
    engine = load_openvino_engine(ModelSpec(model=str(bert_dir), backend="openvino", cache_dir=tmp_path, threads=1))
    assert configs and all(c["CPU_RUNTIME_CACHE_CAPACITY"] == ov_engine.RUNTIME_CACHE_SHAPES for c in configs)
    # Many shapes, more than the cache holds, still answer alike.
    first = top_answer(engine)
    for rows in range(1, 3 * ov_engine.RUNTIME_CACHE_SHAPES // 8 + 2):
        for words in range(1, 9):
            engine.predict([Query(engine.encode("the " * words + "[MASK] one."), 1)] * rows)
    assert top_answer(engine) == first


def test_float32_is_asked_for_explicitly(ov_bert_engine: FillMaskEngine) -> None:
    # OpenVINO's own default on a CPU with AMX is bfloat16: float32 must never be left to it.
    assert ov_engine.precision_of(ov_bert_engine.compiled) == "f32"  # type: ignore[attr-defined]


def test_the_settings_choose_it_with_their_threads(bert_dir: Path, export_cache: Path) -> None:
    settings = Settings(backend="openvino", model=str(bert_dir), cache_dir=str(export_cache), threads=2)
    engine = load_model(settings)
    assert isinstance(engine, OpenVinoFillMaskEngine)
    assert engine.describe()["openvino_threads"] == 2


async def test_serves_http_answers_and_info_names_the_backend(
    make_client: ClientFactory, ov_bert_engine: FillMaskEngine, bert_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=ov_bert_engine, backend="openvino")
    response = await client.post("/", data="paris is the [MASK] of france.")
    assert response.status == 200
    answer = await response.json()
    [[expected]] = bert_engine.predict([Query(bert_engine.encode("paris is the [MASK] of france."), 5)])
    assert [p["token"] for p in answer] == [p["token"] for p in expected]
    info = await (await client.get("/info")).json()
    model = info["model"]
    assert model["backend"] == "openvino" and model["openvino_threads"] == 1
    assert (model["precision"], model["cpu_matrix_features"]) == ("float32", describe_features())
    assert model["export_path"].endswith("model.xml") and len(model["export_cache_key"]) == 32
    assert info["versions"]["openvino"]
    metadata = await (await client.get("/v2/models/maskserve")).json()
    assert metadata["platform"] == "openvino"


# Run in a child: a crash there fails this test instead of killing the whole test session.
SIGNAL_AFTER_ENGINES_END = """
import gc, os, signal, sys
from pathlib import Path
from maskserve.engine.openvino import load_openvino_engine
from maskserve.model_api import ModelSpec

model, cache = sys.argv[1], Path(sys.argv[2])
first = load_openvino_engine(ModelSpec(model=model, backend="openvino", cache_dir=cache, threads=1))
second = load_openvino_engine(ModelSpec(model=model, backend="openvino", cache_dir=cache, threads=2))
del first  # ended before the engine loaded after it
gc.collect()
signal.signal(signal.SIGTERM, lambda *args: print("handled", flush=True))
os.kill(os.getpid(), signal.SIGTERM)
del second
gc.collect()
os.kill(os.getpid(), signal.SIGTERM)
"""


def test_a_signal_after_engines_ended_in_any_order_is_handled(bert_dir: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", SIGNAL_AFTER_ENGINES_END, str(bert_dir), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("handled") == 2
