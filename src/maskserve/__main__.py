"""Entry point: argv and environment -> Settings -> load the model -> serve."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from maskserve.config.bounds import followed
from maskserve.config.flags import load_settings
from maskserve.config.model_configs import model_configs
from maskserve.config.model_source import ModelLoadError, check_local_sources
from maskserve.config.settings import Settings, SettingsError, flag_name
from maskserve.http.app import SETTINGS_CHECKS, create_app
from maskserve.observability.logs import configure_logging
from maskserve.rpc import GrpcPortUnavailable
from maskserve.server.serve import serve

log = logging.getLogger("maskserve")


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["batch"]:
        # A job over a file: the same tasks and engine, no server (batch/cli.py).
        try:
            from maskserve.batch.cli import main as batch_main
        except ModuleNotFoundError as exc:  # pyarrow or tqdm: the batch extra
            print(f"maskserve batch: needs {exc.name}: pip install 'maskserve[batch]'", file=sys.stderr)
            return 2
        return batch_main(arguments[1:])
    try:
        settings = load_settings(arguments, checks=SETTINGS_CHECKS)
    except SettingsError as exc:
        print(f"maskserve: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_json)
    log_followed_defaults(settings)
    try:
        # Before the engine's imports, which take seconds: a folder that is not there fails now.
        check_local_sources(model_configs(settings))
    except ModelLoadError as exc:
        log.error("cannot start: %s", exc)
        return 1
    # Until the server listens and installs its own handlers (serve.StopSignals), a stop signal
    # stops at once: there is nothing to drain yet. Without this, SIGTERM would be ignored while a
    # slow model loads when maskserve is a container's PID 1, and a deleted pod would wait out its
    # whole grace period.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _load_and_serve(settings)
    except KeyboardInterrupt:
        log.info("stopped before serving")
        # The model may still be loading on the inference thread, which nothing can interrupt, and
        # the interpreter would wait for it at exit. Nothing was served and no port is open: there
        # is nothing to clean up, so leave now.
        logging.shutdown()
        os._exit(0)


def log_followed_defaults(settings: Settings) -> None:
    """Say once, before any worker starts, which defaults moved to fit the limits the user set: the
    server's, then each models-file model's own (resolved afresh from its entry)."""
    for name, other in followed(settings).items():
        shown = (flag_name(name), getattr(settings, name), flag_name(other), getattr(settings, other))
        log.info("%s is %r: its default follows %s=%r", *shown)
    for config in model_configs(settings):
        if config.settings is settings:  # a --model model: the server's settings, said above
            continue
        for name, other in followed(config.settings).items():
            own = (config.name, name, getattr(config.settings, name), other, getattr(config.settings, other))
            log.info("model %r: %s is %r: its default follows %s=%r", *own)


def _load_and_serve(settings: Settings) -> int:
    if settings.workers > 1:
        # gunicorn forks the workers; each loads its own model (workers.py).
        from maskserve.server.workers import run_workers

        return run_workers(settings)
    from maskserve.engine import BackendUnavailable

    # The app loads the model at start-up, on its inference thread, before the port is opened: a
    # model that cannot be served exits non-zero with nothing half started.
    app = create_app(settings)
    try:
        asyncio.run(serve(app))
    except ModelLoadError as exc:
        log.error("cannot start: %s", exc)
        return 1
    except BackendUnavailable as exc:
        # The backend cannot serve this model here (its export failed): exit 2, as for a setting
        # that cannot be used, rather than serve something else.
        log.error("cannot start: %s", exc)
        return 2
    except GrpcPortUnavailable as exc:  # its message names the gRPC address
        log.error("cannot start: %s", exc)
        return 2
    except SettingsError as exc:  # a setting the models cannot live with (--models-memory): it names them
        log.error("cannot start: %s", exc)
        return 2
    except OSError as exc:
        # Port taken, address not on this machine, no permission: a setting that cannot be used
        # here (exit 2, as for a bad value), the operator's to fix; a traceback would only hide
        # the one line that says so.
        log.error("cannot start: cannot listen on %s:%d (%s)", settings.host, settings.port, exc.strerror or exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
