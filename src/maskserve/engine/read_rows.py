"""Where a batch is read: the positions whose logits are asked for, laid out as every backend takes them.

A batch is read at a few positions ``(rows, cols)``: a fill-mask text's masks, a scoring copy's one
row. Every backend computes the last encoder layer and the head at those positions only, so it
takes them as a rectangle (:class:`ReadRows`): each batch row's read columns, padded to the most
any row reads, so that the last layer's attention is one batched call, and where each asked
position sits in that rectangle, in the order asked. The exported graphs take the same two arrays
as inputs (``onnx_export.INPUTS``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ReadRows:
    """The read positions of a padded batch, as the last layer and the head take them."""

    # (batch, most reads of any row): each row's read columns, then column 0 as padding (a padded
    # slot is computed like any other and never read: cheaper than a ragged layout).
    columns: np.ndarray
    # (reads,): each asked position's place in ``columns`` flattened, ``row * width + slot``, in the
    # order the positions were asked.
    index: np.ndarray

    @classmethod
    def at(cls, batch: int, rows: np.ndarray, cols: np.ndarray) -> ReadRows:
        """The layout of positions ``(rows, cols)`` of a batch of ``batch`` rows; any order, no repeats."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        counts = np.bincount(rows, minlength=batch)
        # At least one slot: a graph's shapes stay valid for a batch read nowhere.
        width = max(int(counts.max(initial=0)), 1)
        # A position's slot is how many positions of its row were asked before it.
        order = np.argsort(rows, kind="stable")
        firsts = np.cumsum(counts) - counts
        slots = np.empty_like(rows)
        slots[order] = np.arange(len(rows), dtype=np.int64) - firsts[rows[order]]
        columns = np.zeros((batch, width), dtype=np.int64)
        columns[rows, slots] = cols
        return cls(columns, rows * width + slots)

    def asked(self) -> tuple[np.ndarray, np.ndarray]:
        """The positions ``(rows, cols)`` this layout reads, in the order asked: :meth:`at`'s inverse."""
        width = self.columns.shape[1]
        return self.index // width, self.columns.reshape(-1)[self.index]
