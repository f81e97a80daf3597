"""The HAProxy agent (--agent-port): one line a connection, the weight falling with the load, never to 0."""

from __future__ import annotations

import asyncio

from maskserve.request.keys import SERVICE_KEY
from maskserve.serving.costs import BatchReport
from tests.conftest import ClientFactory
from tests.fakes import ControlledModel, default_parts, holding, wait_for_depth
from tests.live_server import free_port


async def agent_says(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        line = await asyncio.wait_for(reader.read(100), 5)
        assert await reader.read() == b""  # one line, then the agent closes
    finally:
        writer.close()
    return line.decode("ascii")


async def test_an_idle_server_reports_full_weight(make_client: ClientFactory) -> None:
    port = free_port()
    await make_client(agent_port=port)
    assert await agent_says(port) == "ready up 100%\n"


async def test_the_weight_falls_as_the_queue_fills_but_never_to_zero(make_client: ClientFactory) -> None:
    port = free_port()
    model = ControlledModel()
    client = await make_client(engine=model, agent_port=port, max_queue=4, max_inputs=4)
    async with holding(client, model, queued=["b0 [MASK]", "b1 [MASK]"]) as held:
        assert await agent_says(port) == "ready up 50%\n"
        held.queued += [asyncio.create_task(client.post("/", data=f"c{i} [MASK]")) for i in range(2)]
        await wait_for_depth(default_parts(client).batcher, 4)
        assert await agent_says(port) == "ready up 1%\n"  # full, and still in rotation
    assert await held.statuses() == [200] * 5
    assert await agent_says(port) == "ready up 100%\n"


async def test_a_predicted_wait_near_the_deadline_lowers_the_weight(make_client: ClientFactory) -> None:
    port = free_port()
    client = await make_client(agent_port=port, request_timeout=10.0)
    # Measured: every pass takes 4 s, so one more text waits 4 s of a 10 s deadline.
    for tokens in (10, 20):
        report = BatchReport(size=1, real_tokens=tokens, padded_tokens=tokens, seconds=4.0, failed=0)
        default_parts(client).batcher.cost.observe(report)
    assert await agent_says(port) == "ready up 60%\n"


async def test_a_draining_server_tells_the_balancer_to_drain(make_client: ClientFactory) -> None:
    port = free_port()
    client = await make_client(agent_port=port)
    client.app[SERVICE_KEY].lifecycle.start_draining()
    assert await agent_says(port) == "drain\n"
