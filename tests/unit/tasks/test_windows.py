"""The window rule: which run of a long text each asked position is read in."""

from __future__ import annotations

import pytest

from maskserve.tasks.windows import Layout, Window, fits, windows, word_windows

# A model of 20 tokens, [CLS] before and [SEP] after each text: 18 of the text's own a window,
# a quarter of which (4) is each side's least context, so a group spans at most 10.
LAYOUT = Layout(20, (1, 1))


def word_ids(n_words: int, split: frozenset[int] = frozenset()) -> list[int | None]:
    """A text of ``n_words`` one-token words between [CLS] and [SEP]; a word in ``split`` takes two tokens."""
    ids: list[int | None] = [None]
    for word in range(n_words):
        ids += [word, word] if word in split else [word]
    return [*ids, None]


def test_a_text_that_fits_the_model_needs_no_window() -> None:
    assert fits(20, LAYOUT) and not fits(21, LAYOUT)
    assert LAYOUT.inner == 18 and LAYOUT.narrower(3) == Layout(17, (1, 1))


def test_a_lone_position_is_centred_in_its_window() -> None:
    (window,) = windows(word_ids(100), [(50, 50)], LAYOUT)
    assert (window.start, window.end) == (42, 60) and window.asked == ((50, 50),)
    assert 50 - window.start == 8 and window.end - 1 - 50 == 9


def test_a_window_past_an_end_of_the_text_moves_inside_it() -> None:
    ids = word_ids(100)
    first, last = windows(ids, [(1, 1), (100, 100)], LAYOUT)
    assert (first.start, first.end) == (1, 19)
    assert (last.start, last.end) == (83, 101)  # the [SEP] at 101 is the text's own, kept apart


def test_positions_within_half_a_window_share_one_and_others_get_their_own() -> None:
    placed = windows(word_ids(100), [(30, 30), (39, 39), (40, 40), (70, 70)], LAYOUT)
    assert [w.asked for w in placed] == [((30, 30), (39, 39)), ((40, 40),), ((70, 70),)]
    for window in placed:
        first, last = window.asked[0][0], window.asked[-1][1]
        # Every position has at least a quarter window of context on each side.
        assert first - window.start >= 4 and window.end - 1 - last >= 4
        assert window.end - window.start <= LAYOUT.inner


def test_positions_come_back_in_text_order_whatever_order_they_were_asked_in() -> None:
    placed = windows(word_ids(100), [(70, 70), (5, 5), (40, 40)], LAYOUT)
    assert [w.asked for w in placed] == [((5, 5),), ((40, 40),), ((70, 70),)]


def test_no_window_cuts_a_word() -> None:
    # Words of two tokens everywhere: a window's first token starts a word, its last ends one.
    ids = word_ids(100, frozenset(range(100)))
    for position in (3, 60, 101, 150, 199):
        (window,) = windows(ids, [(position, position)], LAYOUT)
        assert window.start <= position < window.end
        assert ids[window.start - 1] != ids[window.start] and ids[window.end - 1] != ids[window.end]
        assert window.end - window.start <= LAYOUT.inner


def test_a_span_lies_whole_in_its_window() -> None:
    (window,) = windows(word_ids(100), [(50, 55)], LAYOUT)
    assert window.start <= 50 and window.end > 55


def test_window_ids_keep_the_texts_special_tokens_around_its_run() -> None:
    input_ids = (101, *range(1000, 1100), 102)
    window = Window(40, 58, ((50, 50),))
    ids = window.ids(input_ids, LAYOUT)
    assert ids == (101, *range(1039, 1057), 102) and len(ids) == LAYOUT.length
    assert ids[window.local(50, LAYOUT)] == input_ids[50]
    with pytest.raises(ValueError, match="outside the window"):
        window.local(58, LAYOUT)


def test_a_span_outside_the_text_or_wider_than_a_group_is_a_bug() -> None:
    with pytest.raises(ValueError, match="this is a bug"):
        windows(word_ids(100), [(0, 0)], LAYOUT)  # the [CLS]
    with pytest.raises(ValueError, match="this is a bug"):
        windows(word_ids(100), [(10, 30)], LAYOUT)


def test_each_word_length_reads_every_mask_in_a_window_that_much_narrower_or_none_where_it_fits() -> None:
    # A text of 20 tokens, as long as the model reads: a one-token word fits whole, a longer one does not.
    ids = word_ids(18)
    found = word_windows(len(ids), [3, 15], [1, 2, 3], LAYOUT, ids)
    assert found[1] == {}
    for length in (2, 3):
        narrow = LAYOUT.narrower(length - 1)
        assert set(found[length]) == {3, 15}
        for position, (window, layout) in found[length].items():
            assert layout == narrow and window.start <= position < window.end
            assert window.end - window.start <= narrow.inner
        cut = windows(ids, [(3, 3), (15, 15)], narrow)
        assert {(w.start, w.end) for w, _ in found[length].values()} == {(w.start, w.end) for w in cut}
    with pytest.raises(ValueError, match="without its words"):
        word_windows(len(ids), [3], [2], LAYOUT, None)
