"""Entry point: argv and environment -> Settings -> load the model -> serve."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from aiohttp import web

from .app import create_app, load_model
from .logs import AccessLogger, configure_logging
from .settings import SettingsError, load_settings

log = logging.getLogger("maskserve")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(sys.argv[1:] if argv is None else argv)
    except SettingsError as exc:
        print(f"maskserve: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_json)
    # Load before binding the port: a model that cannot be served exits non-zero with nothing
    # half started.
    from .engine import BackendUnavailable, ModelLoadError

    try:
        model = load_model(settings)
    except ModelLoadError as exc:
        log.error("cannot start: %s", exc)
        return 1
    except BackendUnavailable as exc:
        # --backend cannot serve this model as asked (a failed export, a missing package): refuse
        # rather than serve it some other way.
        log.error("cannot start: %s", exc)
        return 2
    app = create_app(settings, engine=model)
    log.info("serving %s on http://%s:%d/", model.name, settings.host, settings.port)
    try:
        web.run_app(
            app,
            host=settings.host,
            port=settings.port,
            # Cancel a handler when its client disconnects, so its queued texts are dropped unrun.
            handler_cancellation=True,
            # Handlers finish within the drain budget (see app.drain_on_shutdown); then a margin.
            shutdown_timeout=settings.drain_timeout + 1.0,
            access_log_class=AccessLogger,
            access_log=logging.getLogger("maskserve.access"),
            print=None,
        )
    except OSError as exc:
        # Port taken, address not on this machine, no permission: the operator's to fix, and a
        # traceback would only hide the one line that says so.
        log.error("cannot start: cannot listen on %s:%d (%s)", settings.host, settings.port, exc.strerror or exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
