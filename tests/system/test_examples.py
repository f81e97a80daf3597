"""The examples: the plug-in (examples/ratelimit) limits each key over HTTP, the task (examples/task) is served
with its route, and the BLiMP job (examples/blimp.py) prints what its batch outputs give."""

from __future__ import annotations

import importlib.metadata
import json
import statistics
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from maskserve.config.flags import load_settings
from maskserve.config.settings import SettingsError
from maskserve.engine import FillMaskEngine
from maskserve.http.app import SETTINGS_CHECKS, create_app
from maskserve.http.routes import ROUTES
from maskserve.middleware.chain import ENTRY_POINT_GROUP
from tests.live_server import child_env
from tests.models import LONG_TEXT
from tests.paths import ROOT
from tests.unit.middleware.test_error_sanitizer import error_of

PLUGIN_DIR = ROOT / "examples" / "ratelimit"
SPEC = "default,+maskserve_ratelimit:factory"
PARIS = b"paris is the [MASK] of france."
KEY_A = "key-a-0123456789abcdef"
KEY_B = "key-b-0123456789abcdef"


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example importable as an operator would have it: its folder on the path."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    # One token a minute: nothing refills while the test runs, so the count is exact.
    monkeypatch.setenv("RATELIMIT_BURST", "3")
    monkeypatch.setenv("RATELIMIT_PER_MINUTE", "1")
    yield importlib.import_module("maskserve_ratelimit")


async def serve(
    aiohttp_client: Any, engine: FillMaskEngine, argv: list[str]
) -> TestClient[web.Request, web.Application]:
    """The real path: flags and environment -> load_settings -> create_app -> HTTP."""
    settings = load_settings(argv, env={"MASKSERVE_API_KEY": f"{KEY_A},{KEY_B}"}, checks=SETTINGS_CHECKS)
    client: TestClient[web.Request, web.Application] = await aiohttp_client(create_app(settings, engine=engine))
    return client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_the_rate_limiter_loaded_through_the_setting_limits_each_key(
    plugin: ModuleType, aiohttp_client: Any, bert_engine: FillMaskEngine
) -> None:
    client = await serve(aiohttp_client, bert_engine, ["--middleware", SPEC])
    for _ in range(3):
        assert (await client.post("/", data=PARIS, headers=bearer(KEY_A))).status == 200
    refused = await client.post("/", data=PARIS, headers=bearer(KEY_A))
    error = await error_of(refused, 429, "rate_limited")
    assert "quota" in error["error"]
    # The next token comes in a minute: Retry-After says so, in whole seconds.
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # Another key has its own bucket; probes are never limited.
    assert (await client.post("/", data=PARIS, headers=bearer(KEY_B))).status == 200
    assert (await client.get("/livez")).status == 200
    info = await (await client.get("/info", headers=bearer(KEY_B))).json()
    # +: it reads no body, so it sits after auth and before the breaker.
    assert info["middleware"] == ["metrics", "errors", "auth", "maskserve_ratelimit:factory", "circuit_breaker"]


async def test_the_installed_entry_point_loads_the_example_by_name(
    plugin: ModuleType, aiohttp_client: Any, bert_engine: FillMaskEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The entry point exactly as the example's pyproject.toml declares it, as if pip-installed.
    declared = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text(encoding="utf-8"))
    entries = declared["project"]["entry-points"][ENTRY_POINT_GROUP]
    found = importlib.metadata.EntryPoints(
        [importlib.metadata.EntryPoint(name=n, value=v, group=ENTRY_POINT_GROUP) for n, v in entries.items()]
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda *, group: found)
    client = await serve(aiohttp_client, bert_engine, ["--middleware", "default,+ratelimit"])
    statuses = [(await client.post("/", data=PARIS, headers=bearer(KEY_A))).status for _ in range(4)]
    assert statuses == [200, 200, 200, 429]


def test_a_bad_limit_stops_start_up_naming_the_stage(plugin: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATELIMIT_BURST", "lots")
    with pytest.raises(SettingsError, match=r"'maskserve_ratelimit:factory': the factory failed .*RATELIMIT_BURST"):
        load_settings(["--middleware", SPEC], env={}, checks=SETTINGS_CHECKS)


def test_buckets_refill_at_the_rate_and_stay_bounded(plugin: ModuleType) -> None:
    now = [0.0]
    buckets = plugin.TokenBuckets(per_minute=60, burst=2, max_keys=2, clock=lambda: now[0])
    assert [buckets.take("a"), buckets.take("a")] == [0.0, 0.0]
    assert buckets.take("a") == pytest.approx(1.0)  # one token a second
    now[0] += 1.0
    assert buckets.take("a") == 0.0
    # A third key pushes out the least recently seen one, which comes back with a full bucket.
    buckets.take("b")
    buckets.take("c")
    assert len(buckets) == 2 and "a" not in buckets
    assert buckets.take("a") == 0.0


# -- the example task (examples/task): a task is its module and its route entry ------------------


@pytest.fixture
def filled_task(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "task"))
    return importlib.import_module("filled")


async def serve_with(
    aiohttp_client: Any, engine: FillMaskEngine, routes: tuple[Any, ...] | None = None
) -> TestClient[web.Request, web.Application]:
    settings = load_settings([], env={}, checks=SETTINGS_CHECKS)
    app = create_app(settings, engine=engine) if routes is None else create_app(settings, engine=engine, routes=routes)
    client: TestClient[web.Request, web.Application] = await aiohttp_client(app)
    return client


async def test_the_example_task_fills_each_mask_with_the_best_guess_of_post_root(
    filled_task: ModuleType, aiohttp_client: Any, bert_engine: FillMaskEngine
) -> None:
    client = await serve_with(aiohttp_client, bert_engine, (*ROUTES, filled_task.FILLED_ROUTE))
    # The last text is longer than the test model reads (128 tokens): read in windows, as POST / reads it.
    texts = ["paris is the [MASK] of france.", "the [MASK] barked at the [MASK].", LONG_TEXT]
    response = await client.post("/filled", json={"inputs": texts})
    assert response.status == 200, await response.text()
    assert int(response.headers["X-Batch-Size"]) >= 1 and response.headers["X-Text-Windows"] == "1, 1, 2"
    best = await (await client.post("/", json={"inputs": texts, "parameters": {"top_k": 1}})).json()
    expected = []
    for text, masks in zip(texts, best, strict=True):
        masks = masks if isinstance(masks[0], list) else [masks]
        for guesses in masks:
            text = text.replace("[MASK]", guesses[0]["token_str"].strip(), 1)
        expected.append({"filled": text})
    assert await response.json() == expected


async def test_the_example_task_refuses_bad_input_as_every_route_does(
    filled_task: ModuleType, aiohttp_client: Any, bert_engine: FillMaskEngine
) -> None:
    client = await serve_with(aiohttp_client, bert_engine, (*ROUTES, filled_task.FILLED_ROUTE))
    error = await error_of(await client.post("/filled", data=b"no mask here"), 422, "no_mask_token")
    assert "[MASK]" in error["error"]
    assert (await client.post("/filled", data=PARIS)).status == 200  # still serving


async def test_the_example_task_is_in_the_openapi_document_only_when_served(
    filled_task: ModuleType, aiohttp_client: Any, bert_engine: FillMaskEngine
) -> None:
    served = await serve_with(aiohttp_client, bert_engine, (*ROUTES, filled_task.FILLED_ROUTE))
    paths = (await (await served.get("/openapi.json")).json())["paths"]
    assert paths["/filled"]["post"]["operationId"] == "filled"
    default = await serve_with(aiohttp_client, bert_engine)
    assert "/filled" not in (await (await default.get("/openapi.json")).json())["paths"]
    assert (await default.post("/filled", data=PARIS)).status == 404


# -- the BLiMP example (examples/blimp.py): maskserve batch as a user runs it, accuracy per paradigm -------


@pytest.mark.slow
def test_the_blimp_example_prints_each_paradigms_accuracy_as_the_batch_outputs_give_it(tmp_path: Path) -> None:
    sample = ROOT / "benchmarks" / "data" / "blimp-sample.jsonl"
    pairs = [json.loads(line) for line in sample.read_text(encoding="utf-8").splitlines()]
    command = [sys.executable, str(ROOT / "examples" / "blimp.py"), str(sample), "--work", str(tmp_path)]
    done = subprocess.run([*command, "--", "--quiet"], capture_output=True, text=True, env=child_env(), timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{len(pairs)} pairs, {2 * len(pairs)} sentences" in done.stderr
    rows = [line.strip("|").split("|") for line in done.stdout.splitlines() if line.startswith("| ")]
    cells = {row[0].strip(): [cell.strip() for cell in row[1:]] for row in rows}
    assert cells["paradigm"] == ["pairs", "original", "within_word_l2r"]
    assert cells["phenomenon"] == ["paradigms", "original", "within_word_l2r"]
    uids = sorted({pair["UID"] for pair in pairs})
    assert len(uids) == 67 and all(cells[uid][0] == "3" for uid in uids)
    for column, metric in enumerate(("original", "within_word_l2r"), start=1):
        # Computed here from the job's own output, independently of the example's code.
        scores = {}
        for line in (tmp_path / f"scores-{metric}.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            scores[row["id"]] = row["result"]["score"]
        assert len(scores) == 2 * len(pairs)
        expected = {
            uid: 100
            * statistics.fmean(
                scores[f"{uid}/{p['pairID']}/good"] > scores[f"{uid}/{p['pairID']}/bad"]
                for p in pairs
                if p["UID"] == uid
            )
            for uid in uids
        }
        shown = {uid: float(cells[uid][column]) for uid in uids}
        assert all(0.0 <= value <= 100.0 for value in shown.values())
        assert shown == pytest.approx({uid: round(value, 1) for uid, value in expected.items()}, abs=1e-9)
        overall_row = next(cells[name] for name in cells if name.startswith("**overall**"))
        assert float(overall_row[column].strip("*")) == pytest.approx(round(statistics.fmean(expected.values()), 1))
