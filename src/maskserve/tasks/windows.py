"""Texts longer than the model reads: windows of the model's length around the positions asked about.

A text the model reads whole is read whole, as always. A longer one is read in windows, each the
tokenizer's special tokens around a run of the text's own tokens, as long as the model reads. The
positions a request asks about (a fill-mask text's masks, the tokens ``/score`` scores, the masks a
whole word's copies fill) are grouped in text order, a group spanning at most half a window: the
window is centred on its group, so each position in it sees at least a quarter of a window on each
side, where the text has that much. A window that would run past either end of the text moves
inside it; then each of its edges moves inwards to the nearest word boundary, so that no window
cuts a word (the model never reads half a word at an edge, and a window decodes back to a text
that tokenizes the same). Positions that fit one window share it, so a long text costs as many
windows as its positions need. Pure arithmetic: no model, no HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from maskserve.model_api import FillMaskModel

# What a request asks for a text longer than the model reads: windows, or a 422 (for a user who
# needs the model's reading of the whole text, not of windows of it).
LongText = Literal["window", "refuse"]
LONG_TEXTS: tuple[LongText, ...] = ("window", "refuse")
DEFAULT_LONG_TEXT: LongText = "window"

# Token positions count the whole text's tokens, special tokens included, as input_ids does.


@dataclass(frozen=True)
class Layout:
    """How a model reads a text: how many tokens at most, and how many special tokens the
    tokenizer puts before and after the text's own."""

    length: int
    around: tuple[int, int]

    @property
    def inner(self) -> int:
        """How many of the text's own tokens one window holds."""
        return self.length - sum(self.around)

    @property
    def reach(self) -> int:
        """The most tokens one group of asked positions spans, first to last: what a window holds
        less a quarter of it on each side, the least context each position sees."""
        return self.inner - 2 * (self.inner // 4)

    @classmethod
    def of(cls, model: FillMaskModel) -> Layout:
        return cls(model.max_tokens, model.specials_around)

    def narrower(self, tokens: int) -> Layout:
        """The layout of a window that grows by ``tokens`` once read (a whole word's copy puts
        k tokens where one mask was): so many fewer of the text's own tokens fit."""
        return Layout(self.length - tokens, self.around)


@dataclass(frozen=True)
class Window:
    """One window of a text: the run ``[start, end)`` of its tokens, and the asked spans it answers."""

    start: int
    end: int
    # The spans it was cut for, (first, last) inclusive, in text order.
    asked: tuple[tuple[int, int], ...]

    def ids(self, input_ids: Sequence[int], layout: Layout) -> tuple[int, ...]:
        """The window's token ids: the text's special tokens around its run of the text."""
        before, after = layout.around
        return (*input_ids[:before], *input_ids[self.start : self.end], *input_ids[len(input_ids) - after :])

    def local(self, position: int, layout: Layout) -> int:
        """Where the text's token at ``position`` sits in :meth:`ids`."""
        if not self.start <= position < self.end:
            raise ValueError(f"position {position} is outside the window [{self.start}, {self.end}); this is a bug")
        return position - self.start + layout.around[0]


def fits(n_tokens: int, layout: Layout) -> bool:
    """Whether the model reads a text of ``n_tokens`` (special tokens included) whole."""
    return n_tokens <= layout.length


def windows(word_ids: Sequence[int | None], asked: Sequence[tuple[int, int]], layout: Layout) -> list[Window]:
    """The windows a text of ``word_ids`` (each token's word, None for a special token) is read
    in, to answer every span of ``asked`` (first and last position, inclusive; any order).

    Each span lies whole in exactly one window; the windows come in text order.
    """
    width, reach = layout.inner, layout.reach
    lowest, highest = layout.around[0], len(word_ids) - layout.around[1]
    if width < 4:
        raise ValueError(f"a window of {layout.length} tokens holds too few of the text's own; this is a bug")
    groups: list[list[tuple[int, int]]] = []
    for span in sorted(set(asked)):
        if not lowest <= span[0] <= span[1] < highest or span[1] - span[0] >= reach:
            raise ValueError(f"the asked span {span} is outside the text or wider than a window; this is a bug")
        if groups and span[0] - groups[-1][0][0] < reach and span[1] - groups[-1][0][0] < width:
            groups[-1].append(span)
        else:
            groups.append([span])
    return [_placed(group, word_ids, width, lowest, highest) for group in groups]


def word_windows(
    n_tokens: int,
    positions: Sequence[int],
    lengths: Iterable[int],
    layout: Layout,
    word_ids: Sequence[int | None] | None,
) -> dict[int, dict[int, tuple[Window, Layout]]]:
    """For each word length, the window each mask's copies are read in, and its layout: a word of
    k tokens grows its text's copies by k - 1, so they are read in windows that much narrower,
    around every mask. A length whose copies fit the model whole maps no mask. ``word_ids``, the
    text's words, must be given when any length needs windows."""
    found: dict[int, dict[int, tuple[Window, Layout]]] = {}
    for length in lengths:
        found[length] = {}
        if fits(n_tokens + length - 1, layout):
            continue
        if word_ids is None:
            raise ValueError("a text longer than the model reads is planned without its words; this is a bug")
        narrow = layout.narrower(length - 1)
        for window in windows(word_ids, [(position, position) for position in positions], narrow):
            found[length].update((span[0], (window, narrow)) for span in window.asked)
    return found


def _placed(
    group: Sequence[tuple[int, int]], word_ids: Sequence[int | None], width: int, lowest: int, highest: int
) -> Window:
    """The window of ``width`` centred on ``group``, inside the text, its edges on word boundaries."""
    first, last = group[0][0], max(span[1] for span in group)
    start = first - (width - (last - first + 1)) // 2
    start = max(lowest, min(start, highest - width))
    end = min(start + width, highest)

    def same_word(left: int, right: int) -> bool:
        return word_ids[left] is not None and word_ids[left] == word_ids[right]

    # Never past the group's own tokens: a word longer than the margin is cut rather than dropped.
    while lowest < start < first and same_word(start - 1, start):
        start += 1
    while last + 1 < end < highest and same_word(end - 1, end):
        end -= 1
    return Window(start, end, tuple(group))
