from __future__ import annotations

from tests.conftest import ClientFactory


async def test_raw_text_answers_predictions(make_client: ClientFactory) -> None:
    client = await make_client()
    response = await client.post("/", data=b"paris is the [MASK] of france.")
    assert response.status == 200
    body = await response.json()
    assert len(body) == 5
    assert {"score", "token", "token_str", "sequence"} == set(body[0])
