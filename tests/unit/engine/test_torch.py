"""--quantize int8: dynamic int8 linear layers on CPU, answering in the same shape."""

from __future__ import annotations

from maskserve.config.flags import load_settings
from maskserve.engine import FillMaskEngine, load_engine
from maskserve.model_api import Query


def test_int8_engine_quantizes_linear_layers_and_keeps_the_top_answer(default_engine: FillMaskEngine) -> None:
    quantized = load_engine(None, threads=1, quantize="int8")
    kinds = {f"{type(m).__module__}.{type(m).__name__}" for m in quantized.model.modules()}
    assert "torch.ao.nn.quantized.dynamic.modules.linear.Linear" in kinds
    assert "torch.nn.modules.linear.Linear" not in kinds  # every Linear was quantized
    text = "Paris is the [MASK] of France."
    [[int8]] = quantized.predict([Query(quantized.encode(text), 5)])
    [[fp32]] = default_engine.predict([Query(default_engine.encode(text), 5)])
    assert len(int8) == 5
    assert int8[0]["token_str"] == fp32[0]["token_str"] == "city"
    assert int8[0]["score"] != fp32[0]["score"]  # really a different computation


def test_quantize_setting_accepts_int8_and_refuses_others() -> None:
    assert load_settings(["--quantize", "int8"], env={}).quantize == "int8"
    assert load_settings([], env={"MASKSERVE_QUANTIZE": "none"}).quantize == "none"
    try:
        load_settings(["--quantize", "int4"], env={})
    except ValueError as exc:
        assert "--quantize" in str(exc) and "int4" in str(exc)
    else:
        raise AssertionError("int4 was accepted")
