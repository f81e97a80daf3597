"""``maskserve batch INPUT OUTPUT``: a job's own options, and every model, backend and limit flag of
the server under the server's own names (parsed by the server's own parser, ``config/flags.py``).

Exit codes: 0 when every row has its result or its error; 1 when the model cannot be loaded or a
stage fails (a disk that fills); 2 for a flag or file that cannot be used (an unknown format, an
output that belongs to another job); 130 on Ctrl-C, with the finished parts kept for the next run.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from maskserve.batch.formats import FormatError, columns, file_format
from maskserve.batch.job import JobOptions, JobReport
from maskserve.batch.job_tasks import TASKS
from maskserve.batch.parts import JobMismatch
from maskserve.config.flags import build_command, load_settings
from maskserve.config.model_configs import check as check_models
from maskserve.config.model_configs import model_configs
from maskserve.config.model_source import ModelLoadError, check_local_sources
from maskserve.config.settings import Settings, SettingsError
from maskserve.observability.logs import configure_logging

log = logging.getLogger("maskserve")

# A part of this many rows is what a kill costs at most; at a few hundred rows a second, seconds.
DEFAULT_PART_ROWS = 1000


def _command() -> click.Command:
    @click.command(
        "maskserve batch",
        context_settings={"help_option_names": ["-h", "--help"]},
        epilog="Every flag of `maskserve --help` that chooses or bounds the model (--model, --backend, "
        "--dtype, --quantize, --max-batch-size, --max-text-tokens, ...) is taken too, by the same name.",
    )
    @click.argument("input_path", metavar="INPUT", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.argument("output_path", metavar="OUTPUT", type=click.Path(dir_okay=False, path_type=Path))
    @click.option(
        "--task", type=click.Choice(TASKS), default="fill-mask", show_default=True, help="What each row asks."
    )
    @click.option(
        "--parameters",
        default=None,
        metavar="JSON",
        help='The API\'s parameters for every row (e.g. \'{"top_k": 10}\' or \'{"metric": "within_word_l2r"}\'); '
        "a row's own parameters override them key by key.",
    )
    @click.option(
        "--part-rows",
        type=click.IntRange(min=1),
        default=DEFAULT_PART_ROWS,
        show_default=True,
        help="Rows per output part: the most a kill can cost.",
    )
    @click.option("--overwrite", is_flag=True, help="Start over: drop the output and any parts of an earlier run.")
    @click.option("--quiet", is_flag=True, help="No progress and no loading lines: the summary line and warnings.")
    @click.option(
        "--ray",
        "ray_address",
        default=None,
        metavar="ADDRESS",
        help="Run on a Ray cluster through Ray Data: local (start one on this machine for the job), "
        "auto or ray://HOST:PORT (join a running one). Needs maskserve[ray].",
    )
    @click.option(
        "--ray-actors",
        type=click.IntRange(min=1),
        default=None,
        help="With --ray: model replicas (Ray actors), each loading the model once [default: one per "
        "--threads CPUs of the cluster].",
    )
    def command(**values: Any) -> dict[str, Any]:
        return values

    return command


def split_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` split into the job's own arguments and the server's flags (with their values)."""
    server = build_command()
    takes_value = {
        name: not option.is_flag
        for option in server.params
        if isinstance(option, click.Option)
        for name in (*option.opts, *option.secondary_opts)
    }
    own: list[str] = []
    flags: list[str] = []
    tokens = list(argv)
    while tokens:
        token = tokens.pop(0)
        name = token.split("=", 1)[0]
        if name in takes_value and name not in ("--help", "-h", "--version"):
            flags.append(token)
            if takes_value[name] and "=" not in token and tokens:
                flags.append(tokens.pop(0))
        else:
            own.append(token)
    return own, flags


def main(argv: Sequence[str]) -> int:
    """``maskserve batch``'s entry: the exit code."""
    own, flags = split_arguments(argv)
    try:
        values = _command().main(own, prog_name="maskserve batch", standalone_mode=False)
    except click.exceptions.Exit as done:
        return int(done.exit_code)
    except click.ClickException as exc:
        print(f"maskserve batch: {exc.format_message()} (maskserve batch --help)", file=sys.stderr)
        return 2
    if not isinstance(values, dict):
        # Out of standalone mode, click answers --help by printing it and returning its exit code
        # in place of the command's return value.
        return int(values or 0)
    try:
        settings = load_settings(flags, checks={"model": check_models})
        options = _options(values)
    except (SettingsError, ValueError) as exc:
        print(f"maskserve batch: {exc}", file=sys.stderr)
        return 2
    # Quiet: the summary and the warnings, not the model's loading lines.
    quiet_level = "warning" if values["quiet"] and settings.log_level in ("debug", "info") else None
    configure_logging(quiet_level or settings.log_level, settings.log_json)
    if values["quiet"]:
        # transformers' bar over the weights it loads, read by huggingface_hub when it is imported
        # (the engine imports both later).
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        check_local_sources(model_configs(settings)[:1])
    except ModelLoadError as exc:
        log.error("cannot start: %s", exc)
        return 1
    try:
        if values["ray_address"] is not None:
            try:
                from maskserve.batch.ray_job import run_on_ray
            except ModuleNotFoundError as exc:
                log.error("cannot run: --ray needs %s: pip install 'maskserve[ray]'", exc.name)
                return 2
            report = run_on_ray(options, settings, values["ray_address"], values["ray_actors"], quiet=values["quiet"])
        else:
            report = _run_here(options, settings, quiet=values["quiet"])
    except KeyboardInterrupt:
        log.error("stopped: the finished parts stay in %s.parts; run the same command to finish", options.output)
        return 130
    except (JobMismatch, FormatError) as exc:
        log.error("cannot run: %s", exc)
        return 2
    except ModelLoadError as exc:
        log.error("cannot start: %s", exc)
        return 1
    print(summary(report, options.output), file=sys.stderr)
    return 0


def _options(values: dict[str, Any]) -> JobOptions:
    """The job's options, checked before any model loads: both formats known, the input a table
    with a text column, the parameters a JSON object."""
    input_path: Path = values["input_path"]
    output_path: Path = values["output_path"]
    file_format(input_path)
    file_format(output_path)
    if input_path.resolve() == output_path.resolve():
        raise ValueError(f"OUTPUT is INPUT ({input_path}); name another file")
    found = columns(input_path)
    if found and "text" not in found:
        raise ValueError(f"{input_path} has no 'text' column (its columns: {', '.join(found)})")
    parameters: Any = {}
    if values["parameters"]:
        try:
            parameters = json.loads(values["parameters"])
        except ValueError:
            raise ValueError("--parameters is not JSON") from None
        if not isinstance(parameters, dict):
            raise ValueError("--parameters must be a JSON object, as the API's parameters are")
    return JobOptions(
        input=input_path,
        output=output_path,
        task=values["task"],
        parameters=parameters,
        part_rows=values["part_rows"],
        overwrite=values["overwrite"],
    )


def _run_here(options: JobOptions, settings: Settings, *, quiet: bool) -> JobReport:
    from maskserve.batch.job import Job
    from maskserve.batch.model import load_job_model
    from maskserve.batch.progress import progress_for

    config = model_configs(settings)[0]
    model, revision = load_job_model(config)
    return Job(options, config, model, revision, progress_for(sys.stderr, quiet)).run()


def summary(report: JobReport, output: Path) -> str:
    """The job's last line: how many rows, results and errors, and where they are."""
    if report.already_complete:
        return f"batch: {output} is complete already ({report.rows} rows); --overwrite runs it again"
    resumed = f", {report.resumed} of them finished by an earlier run" if report.resumed else ""
    return (
        f"batch: {report.rows} rows{resumed}: {report.results} results, {report.errors} errors, "
        f"in {report.seconds:.1f} s -> {output}"
    )
