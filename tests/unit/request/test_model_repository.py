"""What REST and gRPC share of the model repository (request/model_repository.py): a load's
settings, and a model's name checked before anything is loaded or forwarded."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskserve.errors import InvalidInput, ModelConfigInvalid, NotFound
from maskserve.request.keys import SERVICE_KEY
from maskserve.request.model_repository import checked_name, control_of, load_overrides
from tests.conftest import CONTROL_KEY, ClientFactory


def test_a_loads_config_becomes_settings_and_model_files_are_refused() -> None:
    assert load_overrides("beta", {"config": '{"max_top_k": 3}'}) == {"max_top_k": 3}
    assert load_overrides("beta", {}) is None
    with pytest.raises(InvalidInput, match="files cannot be sent") as sent:
        load_overrides("beta", {"file:1/model.onnx": "d2VpZ2h0cw=="})
    assert sent.value.field == "parameters.file:1/model.onnx"
    with pytest.raises(ModelConfigInvalid, match="model 'beta': the load's config is not JSON"):
        load_overrides("beta", {"config": "{"})


@pytest.mark.parametrize("name", ["small/unload?x=", "../x", "..", "beta/../alpha", "", "beta?x=1", "nosuch"])
async def test_a_name_that_is_no_model_is_not_found(
    make_client: ClientFactory, model_repository: Path, name: str
) -> None:
    client = await make_client(
        model_repository=str(model_repository), model_control_mode="explicit", control_key=CONTROL_KEY
    )
    control = control_of(client.app[SERVICE_KEY])
    with pytest.raises(NotFound, match=r"in the model repository; it holds 'alpha', 'beta', 'gamma'$"):
        checked_name(control, name)
    assert checked_name(control, "beta") == "beta"
