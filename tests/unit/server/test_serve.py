"""The runner's drain: after a stop signal, keep serving for the drain delay while /readyz fails,
then close the listener, answer everything accepted, and exit 0."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from maskserve.config.settings import Settings
from maskserve.http.app import create_app
from maskserve.server.serve import serve
from tests.fakes import ControlledModel, wait_until_entered
from tests.live_server import free_port, start_maskserve, wait_until_ready

PARIS = "Paris is the [MASK] of France."


async def wait_until_listening(session: aiohttp.ClientSession, url: str) -> None:
    """Until the in-process server's /readyz answers 200."""
    deadline = time.monotonic() + 60
    while True:
        try:
            async with session.get(url + "readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("the server never became ready")
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_during_the_drain_delay_readyz_fails_and_requests_are_still_answered(tmp_path: Path) -> None:
    server = start_maskserve("--torch-threads", "1", "--drain-delay", "2", log_path=tmp_path / "server.log")
    try:
        await asyncio.to_thread(wait_until_ready, server)
        url = server.url + "/"
        async with aiohttp.ClientSession() as session:
            server.signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.2)

            async with session.get(url + "readyz") as ready:
                assert ready.status == 503
                assert "draining" in [p["code"] for p in (await ready.json())["problems"]]
            async with session.get(url + "livez") as live:
                assert live.status == 200  # a draining replica is not dead

            # Four clients keep asking until shortly before the delay ends, as a balancer would
            # until its health checks see the 503: every one is answered, and told to reconnect.
            async def client() -> list[tuple[int, str | None, str]]:
                answers = []
                while time.monotonic() - signalled < 1.5:
                    async with session.post(url, data=PARIS) as response:
                        body = await response.json()
                        answers.append((response.status, response.headers.get("Connection"), body[0]["token_str"]))
                return answers

            answers = [a for batch in await asyncio.gather(*(client() for _ in range(4))) for a in batch]
            assert answers and set(answers) == {(200, "close", "city")}

            await asyncio.sleep(max(0.0, signalled + 3.0 - time.monotonic()))  # past the delay
            with pytest.raises(aiohttp.ClientConnectorError):
                await session.get(url + "livez")
        exit_code = await asyncio.to_thread(server.wait, 30)
    finally:
        server.kill()
    output = server.log()
    assert exit_code == 0, output
    assert "draining" in output and "Traceback" not in output


@pytest.mark.slow
async def test_a_second_signal_cuts_the_drain_delay_short(tmp_path: Path) -> None:
    server = start_maskserve("--torch-threads", "1", "--drain-delay", "60", log_path=tmp_path / "server.log")
    try:
        await asyncio.to_thread(wait_until_ready, server)
        server.signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        async with aiohttp.ClientSession() as session, session.get(server.url + "/readyz") as ready:
            assert ready.status == 503
        server.signal(signal.SIGINT)
        started = time.monotonic()
        exit_code = await asyncio.to_thread(server.wait, 30)
    finally:
        server.kill()
    assert exit_code == 0
    assert time.monotonic() - started < 15  # not the 60 s delay


async def test_a_request_in_flight_when_the_listener_closes_is_answered() -> None:
    """In-process, with the real runner and a real signal: the held forward pass outlives the
    delay, the listener closes under it, and its client still gets its answer."""
    model = ControlledModel()
    port = free_port()
    app = create_app(Settings(port=port, drain_delay=0.3, drain_timeout=10), engine=model)
    url = f"http://127.0.0.1:{port}/"
    server = asyncio.create_task(serve(app))
    try:
        async with aiohttp.ClientSession() as session:
            await wait_until_listening(session, url)
            model.hold()
            in_flight = asyncio.create_task(session.post(url, data="held [MASK]"))
            await wait_until_entered(model)
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.05)
            async with session.get(url + "readyz") as ready:
                assert ready.status == 503 and ready.headers["Connection"] == "close"
            await asyncio.sleep(0.6)  # the delay is over: the listener closes, the drain waits
            with pytest.raises(aiohttp.ClientConnectorError):
                await session.get(url + "livez")
            assert not server.done()  # still draining the held pass
            model.release()
            response = await in_flight
            assert response.status == 200
            assert (await response.json())[0]["token_str"] == "echo"
            assert response.headers["Connection"] == "close"
        await asyncio.wait_for(server, 10)
    finally:
        model.release()
        if not server.done():
            server.cancel()


async def test_once_serving_the_long_lived_heap_is_out_of_the_collectors_sight() -> None:
    """serve() freezes what start-up loaded, so that neither a full collection while serving nor
    the interpreter's last one at exit walks the libraries' and the model's objects again."""
    port = free_port()
    app = create_app(Settings(port=port), engine=ControlledModel())
    gc.unfreeze()
    server = asyncio.create_task(serve(app))
    try:
        async with aiohttp.ClientSession() as session:
            await wait_until_listening(session, f"http://127.0.0.1:{port}/")
        assert gc.get_freeze_count() > 0
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(server, 10)
    finally:
        if not server.done():
            server.cancel()
        gc.unfreeze()  # give the test process its collector back


async def test_the_private_socket_opens_before_the_public_port_and_the_step_between_them() -> None:
    """A worker catching up with its siblings does it with its private socket open (a sibling's
    change reaches it) and its public port not yet (no client meets it half-joined)."""
    port = free_port()
    app = create_app(Settings(port=port), engine=ControlledModel())
    private = Path(tempfile.mkdtemp(prefix="mss-", dir="/tmp")) / "worker-0.sock"
    seen: dict[str, bool] = {}

    async def between(app: web.Application) -> None:
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(private))) as session,
            session.get("http://worker/livez") as live,
        ):
            seen["private"] = live.status == 200
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            seen["public"] = False
        else:
            seen["public"] = True
            writer.close()

    server = asyncio.create_task(serve(app, private_socket=private, before_public=between))
    try:
        async with aiohttp.ClientSession() as session:
            await wait_until_listening(session, f"http://127.0.0.1:{port}/")
        assert seen == {"private": True, "public": False}
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(server, 10)
    finally:
        if not server.done():
            server.cancel()
        gc.unfreeze()
        shutil.rmtree(private.parent, ignore_errors=True)
