"""A job over a file: rows read, planned, answered and written, in three stages that overlap.

    reading and planning   a thread: a slice of rows at a time, tokenized, deduplicated, packed
    inference              the calling thread: the slice's batches, one forward pass after another
    folding and writing    a thread: the answers folded into rows, the slice written as a part

Each stage hands the next a whole slice through a queue of two, so the inference thread never
waits for the tokenizer or the disk while there is work ahead, and memory holds a few slices
whatever the file's size. Slices whose parts an earlier run finished are skipped (parts.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maskserve.batch.formats import count_rows, read_rows
from maskserve.batch.job_tasks import job_task
from maskserve.batch.manifest import manifest, output_metadata
from maskserve.batch.parts import Parts
from maskserve.batch.progress import Progress, Silent
from maskserve.batch.slices import Outcome, PlannedSlice, fold_slice, job_packing, plan_slice, run_batches
from maskserve.config.model_settings import ModelConfig
from maskserve.model_api import FillMaskModel

log = logging.getLogger(__name__)

# Slices a stage may run ahead of the next: enough that inference always has the next slice
# planned, few enough that memory holds a handful of slices.
AHEAD = 2


@dataclass(frozen=True)
class JobOptions:
    """One job, as ``maskserve batch`` is given it."""

    input: Path
    output: Path
    task: str = "fill-mask"
    # The API's parameters for every row; a row's own parameters override them key by key.
    parameters: dict[str, Any] = field(default_factory=dict)
    # Rows per part: what a kill can cost, and what one slice sorts and deduplicates across.
    part_rows: int = 1000
    overwrite: bool = False


@dataclass(frozen=True)
class JobReport:
    """How a job ended: every row of the input has its result or its error."""

    rows: int
    results: int
    errors: int
    # Rows an earlier run had finished, which this one did not redo.
    resumed: int
    seconds: float
    # The output was there, complete, from an earlier run of the same job: nothing was run.
    already_complete: bool = False


def already_complete(metadata: dict[str, Any], started: float) -> JobReport:
    """The report of a job whose output an earlier run finished: nothing was run."""
    rows, errors = int(metadata["rows"]), int(metadata["errors"])
    return JobReport(rows, rows - errors, errors, rows, time.monotonic() - started, already_complete=True)


class _Failed(Exception):
    """A stage failed; the job stops and re-raises the stage's own exception."""


class Job:
    """One job: its options, and the model it runs (loaded once by the caller)."""

    def __init__(
        self,
        options: JobOptions,
        config: ModelConfig,
        model: FillMaskModel,
        revision: str,
        progress: Progress | None = None,
    ) -> None:
        self.options = options
        self.config = config
        self.model = model
        self.task = job_task(options.task, config.settings)
        self.progress = progress or Silent()
        self.manifest = manifest(
            input_path=options.input,
            config=config,
            revision=revision,
            task=options.task,
            parameters=options.parameters,
            part_rows=options.part_rows,
        )
        settings = config.settings
        self.packing = job_packing(settings)
        self.parts = Parts(options.output)
        self._failure: BaseException | None = None
        self._stop = threading.Event()

    def run(self) -> JobReport:
        """Run the job to its end (or resume it) and join its output; raises :class:`JobMismatch`
        when the output or its parts belong to another job."""
        started = time.monotonic()
        options = self.options
        earlier = self.parts.completed(self.manifest, options.overwrite)
        if earlier is not None:
            return already_complete(earlier, started)
        self.parts.start(self.manifest, options.overwrite)
        finished = self.parts.finished()
        self.progress.start(count_rows(options.input), sum(finished.values()))
        slices = self._run_stages(finished)
        self.progress.finish()
        results, errors = self.parts.counts(slices)
        self.parts.join(slices, output_metadata(self.manifest, results + errors, errors))
        resumed = sum(finished.values())
        return JobReport(results + errors, results, errors, resumed, time.monotonic() - started)

    # -- the stages ------------------------------------------------------------------------------

    def _run_stages(self, finished: dict[int, int]) -> int:
        """Run the three stages over every unfinished slice; returns how many slices the input has."""
        planned: queue.Queue[PlannedSlice | None] = queue.Queue(AHEAD)
        answered: queue.Queue[tuple[PlannedSlice, list[Outcome]] | None] = queue.Queue(AHEAD)
        count = [0]
        planner = threading.Thread(
            target=self._stage, args=(self._plan_all, finished, planned, count), name="batch-plan", daemon=True
        )
        writer = threading.Thread(target=self._stage, args=(self._write_all, answered), name="batch-write", daemon=True)
        planner.start()
        writer.start()
        try:
            while (planned_slice := self._get(planned)) is not None:
                self._put(answered, (planned_slice, run_batches(self.model, planned_slice)))
            self._put(answered, None)
        except _Failed:
            pass
        finally:
            # Done, failed or stopped (Ctrl-C): the writer still writes the slices already answered
            # (work a next run need not redo), then ends; the planner ends at its next hand-over.
            self._stop.set()
            writer.join()
            planner.join(timeout=5.0)
        if self._failure is not None:
            raise self._failure
        return count[0]

    def _stage(self, body: Callable[..., None], *args: Any) -> None:
        try:
            body(*args)
        except _Failed:
            pass
        except BaseException as exc:  # re-raised on the calling thread
            log.debug("batch stage failed", exc_info=True)
            self._failure = exc
            self._stop.set()

    def _plan_all(self, finished: dict[int, int], planned: queue.Queue[PlannedSlice | None], count: list[int]) -> None:
        first_row = 0
        settings_defaults = self.options.parameters
        for number, rows in enumerate(read_rows(self.options.input, self.options.part_rows)):
            count[0] = number + 1
            if number not in finished:
                planned_slice = plan_slice(
                    number, first_row, rows, self.task, self.model, settings_defaults, self.packing
                )
                self._put(planned, planned_slice)
            first_row += len(rows)
        self._put(planned, None)

    def _write_all(self, answered: queue.Queue[tuple[PlannedSlice, list[Outcome]] | None]) -> None:
        while (item := self._get(answered)) is not None:
            planned_slice, outcomes = item
            rows = fold_slice(planned_slice, outcomes, self.task, self.model)
            self.parts.write(planned_slice.number, rows)
            self.progress.advance(len(rows), sum(1 for row in rows if "error" in row))

    def _put(self, into: queue.Queue[Any], item: Any) -> None:
        while True:
            if self._stop.is_set():
                raise _Failed
            try:
                into.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _get(self, source: queue.Queue[Any]) -> Any:
        while True:
            if self._stop.is_set() and source.empty():
                raise _Failed
            try:
                return source.get(timeout=0.1)
            except queue.Empty:
                continue
