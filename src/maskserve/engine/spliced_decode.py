"""A long text decoded again and again with one token changed, in the time of decoding a few words.

Every prediction's ``sequence`` is its whole text decoded with the candidate put in: for a text of
thousands of tokens (one read in windows), decoding it whole for each of top_k candidates of each
mask costs far more than the model's forward passes. A tokenizer's decoding is local, though: the
text comes out as the pieces of its tokens joined by nothing or a space, with clean-up rules that
look at neighbouring tokens only. So the text is cut once into segments, each mask in a segment of
its own with a few tokens of context on each side; each segment is decoded once, and the joins
between them are read off the whole text's own decoding, which must come out exactly as the
segments joined. A candidate then costs the decoding of its mask's segment alone, spliced between
the others. A text whose segments do not join back exactly is decoded whole every time (exact,
only slower). Pure string work over the tokenizer's ``decode``: no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# Tokens kept on each side of a mask in its own segment: more than any clean-up rule looks at
# (they join a token with its neighbour, such as "do" "n't"), so a changed mask never changes a join.
CONTEXT = 8

# Token ids to text, as the sequence is decoded (special tokens skipped or kept, pads dropped).
Decode = Callable[[Sequence[int]], str]
# How a segment's text meets the next one's in the whole text: how many trailing spaces of the
# first the whole drops (a clean-up rule that joins a space-led token to the punctuation after it,
# as in "cat ." to "cat."), then what comes between: nothing or a space. Tried in this order.
Join = tuple[int, str]
JOINS: tuple[Join, ...] = ((0, ""), (0, " "), (1, ""))


class SplicedText:
    """One text cut into segments around the given positions, each decoded once."""

    def __init__(self, input_ids: Sequence[int], positions: Sequence[int], decode: Decode) -> None:
        self.input_ids = tuple(input_ids)
        self.decode = decode
        # (start, end) of each segment, in text order: around each position, and the runs between.
        self.bounds = _segments(sorted(positions), len(self.input_ids))
        # The segment each position is filled in, by position.
        self.segment_of = {p: i for i, (start, end) in enumerate(self.bounds) for p in positions if start <= p < end}
        self.pieces = [decode(self.input_ids[start:end]) for start, end in self.bounds]
        self.joins = self._joins(decode(self.input_ids))
        # Per segment a position is filled in: the text before it and after it, with their joins
        # to it, so that a candidate costs its own segment's decoding and one concatenation.
        self.around: dict[int, tuple[str, str]] = {}
        if self.joins is not None:
            for index in set(self.segment_of.values()):
                before = after = ""
                for i in range(index):
                    before = self.pieces[i] if i == 0 else _joined(before, self.joins[i - 1], self.pieces[i])
                for i in range(index + 1, len(self.pieces)):
                    after = self.pieces[i] if i == index + 1 else _joined(after, self.joins[i - 1], self.pieces[i])
                self.around[index] = before, after

    def _joins(self, whole: str) -> list[Join] | None:
        """How each segment joins the next in ``whole``; None when the segments do not join back
        into it exactly."""
        if not self.pieces:
            return None
        joined = self.pieces[0]
        joins: list[Join] = []
        for piece in self.pieces[1:]:
            for join in JOINS:
                candidate = _joined(joined, join, piece)
                # A trailing space may be the next join's to drop: the rest must match.
                if whole.startswith(candidate.removesuffix(" ")):
                    joins.append(join)
                    joined = candidate
                    break
            else:
                return None
        return joins if joined == whole else None

    def filled(self, position: int, tokens: Sequence[int]) -> str:
        """The text with ``tokens`` in place of the token at ``position`` (one of the positions
        it was cut around), decoded as the whole text would be."""
        ids = self.input_ids
        index = self.segment_of.get(position)
        if self.joins is None or index is None:
            return self.decode((*ids[:position], *tokens, *ids[position + 1 :]))
        start, end = self.bounds[index]
        text = self.decode((*ids[start:position], *tokens, *ids[position + 1 : end]))
        before, after = self.around[index]
        if index > 0:
            text = _joined(before, self.joins[index - 1], text)
        if index < len(self.pieces) - 1:
            text = _joined(text, self.joins[index], after)
        return text


def _segments(positions: Sequence[int], length: int) -> list[tuple[int, int]]:
    """Segments covering ``length`` tokens: each of ``positions`` (sorted) with its context, those
    that overlap merged, and the runs of tokens between and around them."""
    around: list[tuple[int, int]] = []
    for position in positions:
        start, end = max(0, position - CONTEXT), min(length, position + CONTEXT + 1)
        if around and start <= around[-1][1]:  # overlaps the last: one segment for both
            start = around.pop()[0]
        around.append((start, end))
    segments: list[tuple[int, int]] = []
    cursor = 0
    for start, end in around:
        if start > cursor:
            segments.append((cursor, start))
        segments.append((start, end))
        cursor = end
    if cursor < length:
        segments.append((cursor, length))
    return segments


def _joined(left: str, join: Join, right: str) -> str:
    trim, separator = join
    if trim and not left.endswith(" "):
        return "\0"  # never a prefix of decoded text: this join does not apply
    return left[: len(left) - trim] + separator + right
