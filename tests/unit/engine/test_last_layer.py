"""The last encoder layer at the read rows only: the same rows as the whole layer, for less work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from maskserve.engine import FillMaskEngine, load_engine
from maskserve.engine.last_layer import ReadRowsLastLayer
from maskserve.engine.probe import shortcut_score_bound
from maskserve.engine.read_rows import ReadRows
from tests.models import READ_ROWS_LAYOUTS, SMALL_ENCODER

# Layouts it must not claim: their layers compute something else (other module names, shared
# layers, relative attention, pre-norm, an attention of another kind).
OTHERS = ("distilbert", "albert", "megatron-bert", "mpnet", "xlm-roberta-xl", "nystromformer")


def _encoder(model_type: str, **config: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    options = {**SMALL_ENCODER, **config}
    if model_type == "distilbert":
        options = {"vocab_size": 120, "dim": 32, "n_layers": 3, "n_heads": 4, "hidden_dim": 37}
    built = transformers.AutoConfig.for_model(model_type, **options)
    model: torch.nn.Module = transformers.AutoModel.from_config(built).eval()
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three texts, the last two padded, read at several rows each, given out of order."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (3, 11), generator=generator)
    attention = torch.ones_like(ids)
    attention[1, 7:] = 0
    attention[2, 4:] = 0
    rows = torch.tensor([2, 0, 1, 0, 0, 1])
    cols = torch.tensor([3, 10, 0, 2, 5, 6])
    return ids, attention, rows, cols


def _layout(ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    reads = ReadRows.at(len(ids), rows.numpy(), cols.numpy())
    return torch.from_numpy(reads.columns), torch.from_numpy(reads.index)


@pytest.mark.parametrize("model_type", READ_ROWS_LAYOUTS)
def test_read_rows_equal_the_whole_layers_rows(model_type: str) -> None:
    encoder = _encoder(model_type)
    last_layer = ReadRowsLastLayer.find(encoder)
    assert last_layer is not None
    ids, attention, rows, cols = _batch()
    with torch.inference_mode():
        whole = encoder(input_ids=ids, attention_mask=attention).last_hidden_state[rows, cols]
        read = last_layer(ids, attention, *_layout(ids, rows, cols))
    assert read.shape == whole.shape
    torch.testing.assert_close(read, whole, atol=1e-5, rtol=1e-5)


def test_the_last_layer_computes_only_the_read_rows() -> None:
    encoder = _encoder("bert")
    last_layer = ReadRowsLastLayer.find(encoder)
    assert last_layer is not None
    seen: dict[str, tuple[int, ...]] = {}
    layers = encoder.encoder.layer
    layers[-1].intermediate.register_forward_hook(lambda m, i, o: seen.__setitem__("last", tuple(i[0].shape)))
    layers[-2].intermediate.register_forward_hook(lambda m, i, o: seen.__setitem__("before", tuple(i[0].shape)))
    ids, attention, rows, cols = _batch()
    with torch.inference_mode():
        last_layer(ids, attention, *_layout(ids, rows, cols))
    assert seen["before"] == (3, 11, 32)  # every row of every layer before it
    assert seen["last"] == (3, 3, 32)  # the most any text reads (text 0: three rows)


@pytest.mark.parametrize("model_type", OTHERS)
def test_other_layouts_are_not_claimed(model_type: str) -> None:
    assert ReadRowsLastLayer.find(_encoder(model_type)) is None


def test_relative_position_attention_is_claimed_only_where_it_is_not_built() -> None:
    """transformers 4 builds relative-position tables for this config; transformers 5 dropped them."""
    encoder = _encoder("bert", position_embedding_type="relative_key")
    relative = any(name.endswith("distance_embedding") for name, _ in encoder.named_modules())
    assert (ReadRowsLastLayer.find(encoder) is None) is relative


def test_float32_engine_reads_rows_and_answers_as_the_whole_model(bert_engine: FillMaskEngine) -> None:
    assert bert_engine.describe()["read_rows_last_layer"] == "yes"
    texts = ("the [MASK] of [MASK] .", "a [MASK] in the old house")
    ids, attention = bert_engine._pad([bert_engine.encode(t) for t in texts])
    rows, cols = np.nonzero(ids == bert_engine.mask_token_id)
    with torch.inference_mode():
        logits = bert_engine._mask_logits(ids, attention, rows, cols)
        whole = bert_engine.model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(attention)).logits[
            torch.from_numpy(rows), torch.from_numpy(cols)
        ]
    torch.testing.assert_close(logits, whole, atol=1e-4, rtol=1e-4)


def test_a_disagreeing_last_layer_is_not_kept(bert_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ReadRowsLastLayer.__call__
    monkeypatch.setattr(ReadRowsLastLayer, "__call__", lambda self, *args: real(self, *args) + 1e-2)
    engine = load_engine(str(bert_dir), threads=1)
    assert engine.describe()["read_rows_last_layer"] == "no: it disagreed with the whole model on the probe"
    assert engine.describe()["mask_only_head"] == "yes"


@pytest.mark.parametrize("options", [{"dtype": "bfloat16"}, {"quantize": "int8"}], ids=["bfloat16", "int8"])
def test_lower_precisions_read_rows_within_their_bound(bert_dir: Path, options: dict[str, str]) -> None:
    """bfloat16 and int8 keep the saving: the probe holds them to their own bound against the whole
    model in the same precision (probe.shortcut_score_bound), not to float32's."""
    engine = load_engine(str(bert_dir), threads=1, **options)
    assert engine.describe()["read_rows_last_layer"] == "yes"
    precision = "int8" if options.get("quantize") == "int8" else "bfloat16"
    texts = ("the [MASK] of [MASK] .", "a [MASK] in the old house")
    ids, attention = engine._pad([engine.encode(t) for t in texts])
    rows, cols = np.nonzero(ids == engine.mask_token_id)
    with torch.inference_mode():
        read = engine._mask_logits(ids, attention, rows, cols).float().softmax(-1)
        whole = engine._torch_mask_logits(ids, attention, rows, cols, split=None).float().softmax(-1)  # type: ignore[attr-defined]
    assert float((read - whole).abs().max()) <= shortcut_score_bound(precision)


def test_a_lower_precision_last_layer_past_its_bound_is_not_kept(
    bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ReadRowsLastLayer.__call__
    # Its features shifted by one: a broken layer, which no normalization after it undoes.
    monkeypatch.setattr(ReadRowsLastLayer, "__call__", lambda self, *args: real(self, *args).roll(1, dims=-1))
    engine = load_engine(str(bert_dir), threads=1, dtype="bfloat16")
    assert engine.describe()["read_rows_last_layer"] == "no: it disagreed with the whole model on the probe"
