"""batch/progress.py: lines every few seconds off a terminal, a bar on one, nothing when quiet."""

from __future__ import annotations

import io

from maskserve.batch.progress import Bar, PlainLines, Silent, progress_for


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_say_rows_rate_eta_and_errors_and_skip_a_repeat() -> None:
    stream = io.StringIO()
    lines = PlainLines(stream, every=0.0)
    lines.start(100, 40)
    lines.advance(30, 2)
    lines.finish()  # the same figures as the last line: not shown again
    shown = stream.getvalue().splitlines()
    assert shown[0] == "batch: resuming, 40/100 rows done before"
    assert shown[1].startswith("batch: 70/100 rows (70.0%), ") and shown[1].endswith(", 2 errors")
    assert "rows/s, ETA " in shown[1] and len(shown) == 2


def test_the_display_follows_the_stream() -> None:
    assert isinstance(progress_for(io.StringIO(), quiet=True), Silent)
    assert isinstance(progress_for(io.StringIO(), quiet=False), PlainLines)
    terminal = Terminal()
    bar = progress_for(terminal, quiet=False)
    assert isinstance(bar, Bar)
    bar.start(10, 0)
    bar.advance(10, 1)
    bar.finish()
    assert "10/10" in terminal.getvalue() and "errors=1" in terminal.getvalue()
