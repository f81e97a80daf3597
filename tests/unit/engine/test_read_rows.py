"""engine/read_rows.py: the read positions of a batch, laid out as the last layer and the graphs take them."""

from __future__ import annotations

import numpy as np

from maskserve.engine.read_rows import ReadRows


def test_each_row_reads_its_columns_padded_to_the_most_any_row_reads() -> None:
    rows, cols = np.array([2, 0, 1, 0, 0, 1]), np.array([3, 10, 0, 2, 5, 6])
    reads = ReadRows.at(4, rows, cols)
    # Row 0 reads three columns, in the order asked; row 3 reads none; column 0 pads.
    assert reads.columns.tolist() == [[10, 2, 5], [0, 6, 0], [3, 0, 0], [0, 0, 0]]
    assert reads.index.tolist() == [6, 0, 3, 1, 2, 4]
    assert reads.columns.dtype == reads.index.dtype == np.int64


def test_the_layout_gives_back_the_positions_in_the_order_asked() -> None:
    generator = np.random.default_rng(0)
    for _ in range(50):
        batch, length = int(generator.integers(1, 6)), int(generator.integers(1, 9))
        flat = generator.permutation(batch * length)[: int(generator.integers(0, batch * length + 1))]
        rows, cols = flat // length, flat % length
        asked_rows, asked_cols = ReadRows.at(batch, rows, cols).asked()
        assert asked_rows.tolist() == rows.tolist() and asked_cols.tolist() == cols.tolist()


def test_a_batch_read_nowhere_keeps_one_slot() -> None:
    reads = ReadRows.at(2, np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert reads.columns.shape == (2, 1) and reads.index.shape == (0,)
