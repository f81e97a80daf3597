"""The openvino backend's own behaviour: its precision, its compiled cache, its plugin's bounds.

What every graph backend does alike (refusals, description, the check against torch, its cache,
serving) is in test_graph.py and test_export_cache.py, which run on this backend too; its
bfloat16 agreement is in test_bfloat16.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from maskserve.engine import BackendUnavailable, FillMaskEngine
from maskserve.engine.cpu import describe_features, native_bf16
from maskserve.model_api import Query
from tests.conftest import HAS_OPENVINO, ClientFactory
from tests.unit.engine.conftest import OPENVINO, top_answer

pytestmark = OPENVINO.needed

if HAS_OPENVINO:
    from maskserve.engine import graph as graph_engine
    from maskserve.engine import openvino as ov_engine
    from maskserve.engine import openvino_export
    from maskserve.engine.openvino import OpenVinoFillMaskEngine

NO_NATIVE_BF16 = "this CPU has no AMX or AVX-512 BF16: OpenVINO refuses bfloat16 here"


def test_describes_its_precision_and_compiled_graph(ov_bert_engine: FillMaskEngine) -> None:
    described = ov_bert_engine.describe()
    assert described["precision"] == "float32"
    assert described["cpu_matrix_features"] == describe_features()
    path = Path(str(described["export_path"]))
    assert (path.parent / "model.bin").is_file()
    assert any((path.parent / openvino_export.COMPILED_DIR).iterdir())  # OpenVINO's compiled model


@pytest.mark.skipif(not native_bf16(), reason=NO_NATIVE_BF16)
def test_bfloat16_compiles_the_same_graph_and_says_what_runs_it(ov_bert_engine: FillMaskEngine) -> None:
    cache = ov_bert_engine.export.folder.parent.parent  # type: ignore[attr-defined]
    engine = OPENVINO.load(ov_bert_engine.source, cache, dtype="bfloat16")
    assert isinstance(engine, OpenVinoFillMaskEngine) and engine.export.reused  # one graph, two precisions
    assert engine.dtype == "bfloat16"
    assert ov_engine.precision_of(engine.compiled) == "bf16"
    assert engine.describe()["precision"] in ("bfloat16 on AMX", "bfloat16 on AVX-512 BF16")
    assert engine.describe()["read_rows_last_layer"] == "yes"
    # The last layer and the head, where near-ties are decided, compiled in float32 apart.
    assert engine.describe()["last_layer_precision"] == "float32"
    assert ov_engine.precision_of(engine.compiled.tail) == "f32"
    assert ov_engine.precision_of(engine.compiled.body) == "bf16"
    # And the split answers: the masks' top tokens as float32's.
    texts = ("paris is the [MASK] of france.", "the [MASK] barked.")
    for text in texts:
        (token, score), *_ = top_answer(engine, text)
        (expected_token, expected_score), *_ = top_answer(ov_bert_engine, text)
        assert token == expected_token and score == pytest.approx(expected_score, abs=0.02)


@pytest.mark.skipif(not native_bf16(), reason=NO_NATIVE_BF16)
def test_bfloat16_that_openvino_would_not_run_is_refused(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CPU whose flags promise bfloat16 but whose plugin settles on float32 all the same.
    monkeypatch.setattr(ov_engine, "precision_of", lambda compiled: "f32")
    with pytest.raises(BackendUnavailable, match="needs AMX or AVX-512 BF16") as caught:
        OPENVINO.load(bert_dir, tmp_path, dtype="bfloat16")
    assert "--backend torch" in str(caught.value)


def test_bfloat16_on_a_cpu_without_it_is_refused_before_loading(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This CPU's own case where it has neither AMX nor AVX-512 BF16; forced where it has them.
    monkeypatch.setattr(ov_engine, "native_bf16", lambda: False)
    monkeypatch.setattr(graph_engine, "load_pretrained", lambda *a, **k: pytest.fail("loaded the model"))
    with pytest.raises(BackendUnavailable, match=r"needs AMX or AVX-512 BF16.*--backend torch"):
        OPENVINO.load(bert_dir, tmp_path, dtype="bfloat16")


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
    engine = OPENVINO.load(bert_dir, tmp_path)
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


async def test_info_names_its_precision_and_the_cpus_matrix_features(
    make_client: ClientFactory, ov_bert_engine: FillMaskEngine
) -> None:
    client = await make_client(engine=ov_bert_engine, backend="openvino")
    model = (await (await client.get("/info")).json())["model"]
    assert (model["precision"], model["cpu_matrix_features"]) == ("float32", describe_features())


# Run in a child: a crash there fails this test instead of killing the whole test session.
SIGNAL_AFTER_ENGINES_END = """
import gc, os, signal, sys
from pathlib import Path
from maskserve.engine import load
from maskserve.model_api import ModelSpec

model, cache = sys.argv[1], Path(sys.argv[2])
first = load(ModelSpec(model=model, backend="openvino", cache_dir=cache, threads=1))
second = load(ModelSpec(model=model, backend="openvino", cache_dir=cache, threads=2))
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
