"""model_api.py: a query's size and cost, the pipeline's unwrapping, a copy's one prediction, the
model's description, and the loading spec."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from maskserve.model_api import (
    ModelSpec,
    Prediction,
    Query,
    TextPredictions,
    copy_prediction,
    describe_model,
    text_answer_json,
    unwrap,
)
from tests.fakes import EchoModel


def prediction(token: int, score: float = 0.5) -> Prediction:
    return Prediction(score=score, token=token, token_str=f"t{token}", sequence=f"a t{token} b")


def test_a_query_counts_its_tokens() -> None:
    assert Query(input_ids=(101, 7, 4, 102), top_k=5).n_tokens == 4


def test_a_query_asks_top_k_predictions_per_mask() -> None:
    assert Query(input_ids=(101, 4, 4, 102), top_k=5, n_masks=2).predictions == 10


def test_fewer_targets_than_top_k_bound_the_predictions() -> None:
    assert Query(input_ids=(101, 4, 102), top_k=5, target_ids=(7, 8)).predictions == 2
    assert Query(input_ids=(101, 4, 102), top_k=1, target_ids=(7, 8)).predictions == 1


def test_each_prediction_decodes_the_whole_text_again() -> None:
    assert Query(input_ids=(101, 7, 4, 102), top_k=3).prediction_tokens == 3 * 4


def test_an_answer_the_server_reads_itself_decodes_nothing() -> None:
    assert Query(input_ids=(101, 7, 4, 102), top_k=3, read_by_server=True).prediction_tokens == 0


def test_one_mask_unwraps_to_its_list_of_predictions() -> None:
    one: TextPredictions = [[prediction(1), prediction(2)]]
    assert unwrap(one) == [prediction(1), prediction(2)]


def test_several_masks_keep_one_list_each() -> None:
    two: TextPredictions = [[prediction(1)], [prediction(2)]]
    assert unwrap(two) == two


def test_the_answer_json_is_the_unwrapped_answer() -> None:
    one: TextPredictions = [[prediction(1)]]
    assert json.loads(text_answer_json(one)) == [prediction(1)]
    two: TextPredictions = [[prediction(1)], [prediction(2)]]
    assert json.loads(text_answer_json(two)) == [[prediction(1)], [prediction(2)]]


def test_a_copy_answered_for_its_own_target_gives_that_prediction() -> None:
    copy = Query(input_ids=(101, 4, 102), top_k=1, target_ids=(7,), answer_positions=(1,))
    assert copy_prediction(copy, [[prediction(7)]], "scoring") == prediction(7)


@pytest.mark.parametrize(
    "answer",
    [[[prediction(7)], [prediction(7)]], [[prediction(7), prediction(8)]], [], [[]]],
    ids=["two masks", "two predictions", "no mask", "no prediction"],
)
def test_a_copy_answered_with_other_than_one_prediction_is_a_bug(answer: TextPredictions) -> None:
    copy = Query(input_ids=(101, 4, 102), top_k=1, target_ids=(7,))
    with pytest.raises(RuntimeError, match=r"^a scoring copy was answered .*this is a bug$"):
        copy_prediction(copy, answer, "scoring")


def test_a_copy_answered_for_another_token_is_a_bug() -> None:
    copy = Query(input_ids=(101, 4, 102), top_k=1, target_ids=(7,))
    with pytest.raises(RuntimeError, match="whole-word copy was answered for another token"):
        copy_prediction(copy, [[prediction(8)]], "whole-word")


def test_a_copy_without_a_target_is_a_bug() -> None:
    with pytest.raises(RuntimeError, match="another token"):
        copy_prediction(Query(input_ids=(101, 4, 102), top_k=1), [[prediction(7)]], "scoring")


class DescribedModel(EchoModel):
    def __init__(self) -> None:
        super().__init__()
        self.description: dict[str, str | int | float] = {"device": "cpu", "load_seconds": 1.5}

    def describe(self) -> dict[str, str | int | float]:
        return self.description


def test_a_model_describes_itself_in_a_copy() -> None:
    model = DescribedModel()
    description = describe_model(model)
    assert description == {"device": "cpu", "load_seconds": 1.5}
    description["device"] = "changed"
    assert model.description["device"] == "cpu"


def test_a_model_without_describe_is_described_as_empty() -> None:
    assert describe_model(EchoModel()) == {}


def test_a_spec_names_its_cache_and_defaults_to_torch_on_one_cpu_thread(tmp_path: Path) -> None:
    spec = ModelSpec(model=None, cache_dir=tmp_path)
    assert (spec.backend, spec.device, spec.dtype, spec.threads) == ("torch", "cpu", "auto", 1)
    assert (spec.adaptive_threads, spec.quantize) == (False, "none")


def test_a_spec_is_frozen_and_keyword_only(tmp_path: Path) -> None:
    spec = ModelSpec(model="m", cache_dir=tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.model = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ModelSpec("m", cache_dir=tmp_path)  # type: ignore[misc]
