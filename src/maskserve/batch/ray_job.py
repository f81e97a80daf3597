"""The same job on a Ray cluster, through Ray Data: the input read by Ray, the rows answered by a
pool of actors that each load the model once (:class:`MaskserveRows`, public, for pipelines of your
own), and the answers streamed back in input order into the same parts and output as a local run.

Why the driver writes the output rather than one of Ray's writers: the output is one file in input
order, with each row once, error rows in place, and the same metadata as a local run, so that a
Ray run and a local run of a job can be compared row for row (and one can finish the other's parts).
Ray writes a folder of files in the order blocks finish.

Why JSON Lines is read as text lines and parsed by the actors: a line that is not JSON is one error
row, as it is locally, where Ray's JSON reader would fail the whole job on it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import ray

from maskserve.batch.formats import NOT_AN_OBJECT, NOT_JSON, Row, columns, count_rows, file_format
from maskserve.batch.job import JobOptions, JobReport, already_complete
from maskserve.batch.job_tasks import job_task
from maskserve.batch.manifest import manifest, model_revision, output_metadata
from maskserve.batch.parts import Parts
from maskserve.batch.progress import Progress, progress_for
from maskserve.batch.slices import fold_slice, job_packing, plan_slice, run_batches
from maskserve.config.flags import load_settings
from maskserve.config.model_configs import model_configs
from maskserve.config.settings import Settings

log = logging.getLogger(__name__)

# Rows a map batch holds: enough to sort and deduplicate across and to fill forward passes, few
# enough that an actor's answers come back often and a lost task costs little.
RAY_BATCH_ROWS = 256
# What a read task asks of Ray's CPUs (see _dataset).
READ_CPUS = 0


class MaskserveRows:
    """A callable class for ``ray.data.Dataset.map_batches``: the model loaded once per actor, each
    batch of rows answered as ``maskserve batch`` answers them.

    Takes a batch with a ``text`` column (and optionally ``id`` and ``parameters``, the API's
    parameters as an object or JSON text), or a ``line`` column of JSON Lines text; gives back
    ``id`` (as given, or None), ``result`` and ``error``, each the API's JSON as text or None::

        ds.map_batches(MaskserveRows, fn_constructor_kwargs={"model": "./my-bert", "task": "score"},
                       batch_size=256, num_cpus=2, compute=ray.data.ActorPoolStrategy(size=4))
    """

    def __init__(
        self,
        model: str | None = None,
        task: str = "fill-mask",
        parameters: dict[str, Any] | None = None,
        flags: Sequence[str] = (),
        settings: Settings | None = None,
    ) -> None:
        from maskserve.batch.model import load_job_model

        if settings is None:
            settings = load_settings([*(["--model", model] if model else []), *flags])
        config = model_configs(settings)[0]
        self.model, self.revision = load_job_model(config)
        self.task = job_task(task, config.settings)
        self.parameters = dict(parameters or {})
        self.packing = job_packing(config.settings)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        rows = list(_rows(batch))
        planned = plan_slice(0, 0, rows, self.task, self.model, self.parameters, self.packing)
        answered = fold_slice(planned, run_batches(self.model, planned), self.task, self.model)
        given = [row.get("id") for row in rows]
        return {
            # The row's own id, as JSON text (a column of ids and nulls would come back as floats);
            # "null" for a row without one, which the driver numbers by its place in the input.
            "id": [
                json.dumps(None if ident is None or ident == "" else out["id"]) for ident, out in zip(given, answered)
            ],
            "result": [json.dumps(row["result"], ensure_ascii=False) if "result" in row else None for row in answered],
            "error": [json.dumps(row["error"], ensure_ascii=False) if "error" in row else None for row in answered],
        }


def _rows(batch: dict[str, Any]) -> Iterator[Row]:
    names = list(batch)
    for values in zip(*(batch[name] for name in names)):
        row = {name: _plain(value) for name, value in zip(names, values)}
        line = row.pop("line", None)
        if line is None:
            yield row
            continue
        try:
            parsed = json.loads(line)
        except ValueError:
            parsed = {"__unreadable__": NOT_JSON}
        yield parsed if isinstance(parsed, dict) else {"__unreadable__": NOT_AN_OBJECT}


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (Ray hands columns over as numpy arrays)."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "ndim", 1) == 0 else value


def run_on_ray(options: JobOptions, settings: Settings, address: str, actors: int | None, *, quiet: bool) -> JobReport:
    """Run ``options``'s job through Ray Data on the cluster at ``address`` ("local": one started on
    this machine for the job, and stopped after)."""
    started = time.monotonic()
    config = model_configs(settings)[0]
    own_cluster = address == "local"
    if own_cluster:
        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    try:
        from maskserve.batch.model import model_folder

        revision = model_revision(model_folder(config.source), config.source)
        described = manifest(
            input_path=options.input,
            config=config,
            revision=revision,
            task=options.task,
            parameters=options.parameters,
            part_rows=options.part_rows,
        )
        parts = Parts(options.output)
        earlier = parts.completed(described, options.overwrite)
        if earlier is not None:
            return already_complete(earlier, started)
        parts.start(described, options.overwrite)
        progress = progress_for(sys.stderr, quiet)
        total = count_rows(options.input)
        finished = parts.finished()
        progress.start(total, sum(finished.values()))
        threads = settings.resolved_threads()
        cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
        size = actors or max(1, cpus // max(1, threads))
        answered = _dataset(options.input).map_batches(
            MaskserveRows,
            fn_constructor_kwargs={"task": options.task, "parameters": options.parameters, "settings": settings},
            batch_size=RAY_BATCH_ROWS,
            batch_format="numpy",
            num_cpus=threads,
            compute=ray.data.ActorPoolStrategy(size=size),
        )
        slices = _write_parts(answered, parts, options.part_rows, finished, progress)
        progress.finish()
    finally:
        if own_cluster:
            ray.shutdown()
    results, errors = parts.counts(slices)
    parts.join(slices, output_metadata(described, results + errors, errors))
    resumed = sum(finished.values())
    return JobReport(results + errors, results, errors, resumed, time.monotonic() - started)


def _dataset(path: Path) -> Any:
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    kind = file_format(path)
    # Reading asks for no CPU of Ray's: with any share it waits forever once the model actors hold
    # every CPU of a small cluster (each actor holds its --threads CPUs); it is light beside them.
    if kind == "jsonl":
        # The renaming is a step of its own (a read at no CPU does not fuse with a step at one):
        # it too asks for none, or it waits forever behind actors that hold every CPU.
        return ray.data.read_text(str(path), num_cpus=READ_CPUS).rename_columns({"text": "line"}, num_cpus=READ_CPUS)
    if kind == "csv":
        # Every column as text, as a local run reads it: an id of digits stays as written.
        types = {name: pa.string() for name in columns(path)}
        options = pa_csv.ConvertOptions(column_types=types)
        return ray.data.read_csv(str(path), convert_options=options, num_cpus=READ_CPUS)
    return ray.data.read_parquet(str(path), num_cpus=READ_CPUS)


def _write_parts(answered: Any, parts: Parts, part_rows: int, finished: dict[int, int], progress: Progress) -> int:
    """Stream the answers back in input order into parts of ``part_rows`` rows, numbering rows
    without an id by their place; returns how many parts the input makes."""
    pending: list[Row] = []
    number = 0
    place = 0

    def flush(rows: list[Row]) -> None:
        if number not in finished:
            parts.write(number, rows)
            progress.advance(len(rows), sum(1 for row in rows if "error" in row))

    for batch in answered.iter_batches(batch_size=None, batch_format="numpy"):
        for ident, result, error in zip(batch["id"], batch["result"], batch["error"]):
            own = json.loads(ident)
            row: Row = {"id": place if own is None else own}
            if result is not None:
                row["result"] = json.loads(result)
            else:
                row["error"] = json.loads(error)
            place += 1
            pending.append(row)
            if len(pending) == part_rows:
                flush(pending)
                pending = []
                number += 1
    if pending:
        flush(pending)
        number += 1
    return number
