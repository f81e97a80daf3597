"""The official Hugging Face clients against the real server: their errors show maskserve's message.

``huggingface_hub.InferenceClient`` (Python) and ``@huggingface/inference`` (npm, run by Node.js)
read the Inference API's error shape, ``{"error": "<message>", ...}``: these tests hold maskserve to
it through the clients users really have.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts, wait_for_depth, wait_until_entered
from tests.unit.api.test_views import hub_reaches_localhost  # noqa: F401 - a fixture, used by name

PARIS = "Paris is the [MASK] of France."
# Pinned: the docs' notes on this client (its 503 retries, docs/api.md) are about this version.
JS_CLIENT = "@huggingface/inference@4.13.30"

# (text, parameters, the server's message the client must show). "\u200b" tokenizes to nothing, so
# no vocabulary entry stands for it: the target is unknown to the model.
BAD_REQUESTS = [
    ("Paris is the capital of France.", {}, "holds no mask token; put [MASK] where a word should be filled in"),
    (PARIS, {"top_k": 1000}, "parameters.top_k must be between 1 and 100"),
    (PARIS, {"targets": ["\u200b"]}, "none of parameters.targets is in the model's vocabulary"),
]


@pytest.mark.usefixtures("hub_reaches_localhost")
@pytest.mark.parametrize(("text", "parameters", "message"), BAD_REQUESTS)
async def test_huggingface_hub_client_raises_with_the_servers_message(
    make_client: ClientFactory, text: str, parameters: dict[str, Any], message: str
) -> None:
    client = await make_client()
    hub = InferenceClient(base_url=str(client.make_url("/")))
    with pytest.raises(HfHubHTTPError) as raised:
        await asyncio.to_thread(hub.fill_mask, text, **parameters)
    assert raised.value.response.status_code == 422
    assert message in str(raised.value)
    assert raised.value.server_message is not None and message in raised.value.server_message


@pytest.fixture(scope="module")
def js_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the pinned JS client installed by npm, and a script calling its fillMask."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js and npm are not installed: the JS client cannot run here")
    folder = tmp_path_factory.mktemp("hf-inference-js")
    (folder / "package.json").write_text('{"private": true, "type": "module"}\n')
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", JS_CLIENT],
        cwd=folder,
        check=True,
        timeout=300,
        capture_output=True,
    )
    (folder / "fill_mask.mjs").write_text(
        """import { InferenceClient } from "@huggingface/inference";
// argv: the server's URL, the request's {inputs, parameters}, and the client's options.
const [url, args, options] = process.argv.slice(2);
try {
  const output = await new InferenceClient().fillMask({ endpointUrl: url, ...JSON.parse(args) }, JSON.parse(options));
  console.log(JSON.stringify({ output }));
} catch (error) {
  console.log(JSON.stringify({ name: error.name, message: error.message, status: error.httpResponse?.status }));
}
"""
    )
    return folder


async def fill_mask_js(folder: Path, url: str, request: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        "node",
        "fill_mask.mjs",
        url,
        json.dumps(request),
        json.dumps(options),
        cwd=folder,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, stderr.decode()
    result: dict[str, Any] = json.loads(stdout)
    return result


async def test_js_client_fills_a_mask(make_client: ClientFactory, js_client: Path) -> None:
    client = await make_client()
    answer = await fill_mask_js(js_client, str(client.make_url("/")), {"inputs": PARIS}, {})
    direct = await (await client.post("/", data=PARIS)).json()
    assert answer["output"] == direct


@pytest.mark.parametrize(("text", "parameters", "message"), BAD_REQUESTS)
async def test_js_client_throws_with_the_servers_message(
    make_client: ClientFactory, js_client: Path, text: str, parameters: dict[str, Any], message: str
) -> None:
    client = await make_client()
    request = {"inputs": text, "parameters": parameters}
    error = await fill_mask_js(js_client, str(client.make_url("/")), request, {"retry_on_error": False})
    assert error["status"] == 422
    assert error["message"] == f"Failed to perform inference: {message}" or message in error["message"]
    assert "an HTTP error occurred" not in error["message"]


async def test_js_client_retries_503_at_once_unless_told_not_to(make_client: ClientFactory, js_client: Path) -> None:
    """What the docs warn of: the JS client ignores Retry-After and resends a 503 at once, for
    ever, unless ``retry_on_error: false`` is passed."""
    model = ControlledModel()
    client = await make_client(engine=model, max_queue=1)
    url = str(client.make_url("/"))
    model.hold()
    busy = asyncio.create_task(client.post("/", data=PARIS))
    await wait_until_entered(model)
    queued = asyncio.create_task(client.post("/", data=PARIS))
    await wait_for_depth(default_parts(client).batcher, 1)
    try:
        refused = await fill_mask_js(js_client, url, {"inputs": PARIS}, {"retry_on_error": False})
        assert refused["status"] == 503 and "at capacity" in refused["message"]

        breaker = default_parts(client).admission
        before = breaker.refused["queue_full"]
        retrying = await asyncio.create_subprocess_exec(
            "node", "fill_mask.mjs", url, json.dumps({"inputs": PARIS}), "{}", cwd=js_client
        )
        # Until it has resent a dozen times, or long enough that a busy machine's node got going.
        started = time.monotonic()
        while breaker.refused["queue_full"] - before <= 10 and time.monotonic() - started < 30:
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
        retrying.kill()
        await retrying.wait()
        # Every 503 said Retry-After: 1 or more; a client honouring it sends one a second at most.
        resent = breaker.refused["queue_full"] - before
        assert resent > 10 and resent > elapsed + 1, (resent, elapsed)
    finally:
        model.release()
    await busy
    await queued
