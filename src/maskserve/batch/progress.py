"""How a job shows its progress: a bar on a terminal (tqdm: rows, rows/s, ETA), a plain line every
few seconds anywhere else (a log file, CI), nothing with ``--quiet``."""

from __future__ import annotations

import shutil
import time
from typing import Protocol, TextIO

from tqdm import tqdm

# A plain line this often: often enough to see a job move in a log, rare enough not to flood it.
PLAIN_LINE_SECONDS = 5.0


class Progress(Protocol):
    def start(self, total: int, done: int) -> None:
        """The job holds ``total`` rows, of which ``done`` were finished by an earlier run."""
        ...

    def advance(self, rows: int, errors: int) -> None:
        """``rows`` more rows written, ``errors`` of them error rows."""
        ...

    def finish(self) -> None: ...


class Silent:
    def start(self, total: int, done: int) -> None:
        pass

    def advance(self, rows: int, errors: int) -> None:
        pass

    def finish(self) -> None:
        pass


class Bar:
    """tqdm's bar, the error rows beside it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.bar: tqdm[None] | None = None
        self.errors = 0

    def start(self, total: int, done: int) -> None:
        # The terminal's size, or 80 x 24 where it reports none (a fresh pseudo-terminal), where
        # tqdm would hide its bar as if it were below the screen.
        size = shutil.get_terminal_size()
        self.bar = tqdm(
            total=total,
            initial=done,
            unit="rows",
            file=self.stream,
            ncols=size.columns,
            nrows=size.lines,
            smoothing=0.1,
        )

    def advance(self, rows: int, errors: int) -> None:
        if self.bar is None:
            return
        self.errors += errors
        if self.errors:
            self.bar.set_postfix(errors=self.errors, refresh=False)
        self.bar.update(rows)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.close()


class PlainLines:
    """``batch: 4000/67000 rows (6.0%), 412 rows/s, ETA 2m33s, 3 errors``, every few seconds."""

    def __init__(self, stream: TextIO, every: float = PLAIN_LINE_SECONDS) -> None:
        self.stream = stream
        self.every = every
        self.total = self.done = self.errors = self.this_run = 0
        self.shown = -1  # rows done when the last line was shown
        self.started = self.last = time.monotonic()

    def start(self, total: int, done: int) -> None:
        self.total, self.done = total, done
        self.started = self.last = time.monotonic()
        if done:
            self.stream.write(f"batch: resuming, {done}/{total} rows done before\n")
            self.stream.flush()

    def advance(self, rows: int, errors: int) -> None:
        self.done += rows
        self.this_run += rows
        self.errors += errors
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self._line(now)

    def finish(self) -> None:
        if self.shown != self.done or not self.total:  # the last line, unless it was just shown
            self._line(time.monotonic())

    def _line(self, now: float) -> None:
        rate = self.this_run / max(now - self.started, 1e-9)
        share = 100.0 * self.done / self.total if self.total else 100.0
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta = "?" if left == float("inf") else f"{int(left // 60)}m{int(left % 60):02d}s"
        line = f"batch: {self.done}/{self.total} rows ({share:.1f}%), {rate:.0f} rows/s, ETA {eta}"
        self.stream.write(f"{line}, {self.errors} errors\n")
        self.shown = self.done
        self.stream.flush()


def progress_for(stream: TextIO, quiet: bool) -> Progress:
    """The progress display for ``stream``: none when quiet, a bar on a terminal, lines otherwise."""
    if quiet:
        return Silent()
    return Bar(stream) if stream.isatty() else PlainLines(stream)
