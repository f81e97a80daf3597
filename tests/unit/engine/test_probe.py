"""probe.py: the check an exported graph passes against torch, with the tiny BERT standing in for the
graph: torch itself passes, a graph whose scores or shape disagree is refused."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from maskserve.engine import FillMaskEngine
from maskserve.engine.export_cache import ExportFailed
from maskserve.engine.probe import Probe, RunGraph
from maskserve.engine.read_rows import ReadRows


@pytest.fixture(scope="module")
def probe(bert_engine: FillMaskEngine) -> Probe:
    return Probe(bert_engine.tokenizer, bert_engine.model)  # type: ignore[attr-defined]


def torch_graph(engine: FillMaskEngine, change: Callable[[np.ndarray], np.ndarray] = lambda x: x) -> RunGraph:
    """The full torch model as a graph would run: logits at the flat mask positions, then ``change``d."""
    model = engine.model  # type: ignore[attr-defined]

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        ids, attention = inputs["input_ids"], inputs["attention_mask"]
        rows, cols = ReadRows(inputs["read_columns"], inputs["read_index"]).asked()
        with torch.inference_mode():
            logits = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(attention)).logits
        return change(logits[torch.from_numpy(rows), torch.from_numpy(cols)].numpy())

    return run


def test_the_probe_is_two_padded_batches_each_with_masks(probe: Probe, bert_engine: FillMaskEngine) -> None:
    (two, two_attention), (one, one_attention) = probe.batches
    assert two.shape[0] == 2 and one.shape[0] == 1
    assert not two_attention.all()  # the shorter text pads
    assert one_attention.all() and (one[0] == two[1][: one.shape[1]]).all()  # the shorter alone
    masks = [int((ids == bert_engine.mask_token_id).sum()) for ids, _ in probe.batches]
    assert masks == [3, 1]
    vocabulary = len(bert_engine.tokenizer)  # type: ignore[attr-defined]
    assert [tuple(expected.shape) for expected in probe.expected] == [(3, vocabulary), (1, vocabulary)]


def test_torch_itself_passes_with_no_difference(probe: Probe, bert_engine: FillMaskEngine) -> None:
    assert probe.check(torch_graph(bert_engine), tolerance=1e-6) <= 1e-6


def test_the_graph_is_given_the_positions_of_the_masks(probe: Probe, bert_engine: FillMaskEngine) -> None:
    seen: list[dict[str, np.ndarray]] = []
    graph = torch_graph(bert_engine)

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        seen.append(inputs)
        return graph(inputs)

    probe.check(run, tolerance=1e-6)
    for (ids, _), inputs in zip(probe.batches, seen, strict=True):
        rows, cols = ReadRows(inputs["read_columns"], inputs["read_index"]).asked()
        assert (ids[rows, cols] == bert_engine.mask_token_id).all()
        assert len(rows) == int((ids == bert_engine.mask_token_id).sum())


def test_a_graph_whose_scores_disagree_is_refused(probe: Probe, bert_engine: FillMaskEngine) -> None:
    reversed_vocabulary = torch_graph(bert_engine, lambda logits: logits[:, ::-1].copy())
    with pytest.raises(ExportFailed, match=r"scores differ from torch.s by up to .* on a probe"):
        probe.check(reversed_vocabulary, tolerance=1e-3)


def test_a_small_difference_within_the_tolerance_passes_and_is_reported(
    probe: Probe, bert_engine: FillMaskEngine
) -> None:
    nudged = torch_graph(bert_engine, lambda logits: logits + np.linspace(0, 1e-3, logits.shape[1], dtype=np.float32))
    largest = probe.check(nudged, tolerance=1e-2)
    assert 0 < largest <= 1e-2
    with pytest.raises(ExportFailed, match=r"more than 1e-09"):
        probe.check(nudged, tolerance=1e-9)


def test_a_graph_answering_nan_is_refused(probe: Probe, bert_engine: FillMaskEngine) -> None:
    with pytest.raises(ExportFailed, match="scores differ"):
        probe.check(torch_graph(bert_engine, lambda logits: np.full_like(logits, np.nan)), tolerance=1.0)


def test_a_graph_answering_another_shape_is_refused_naming_both(probe: Probe, bert_engine: FillMaskEngine) -> None:
    one_row_short = torch_graph(bert_engine, lambda logits: logits[1:])
    with pytest.raises(ExportFailed, match=r"answers shape \(2, \d+\), not \(3, \d+\)"):
        probe.check(one_row_short, tolerance=1.0)
