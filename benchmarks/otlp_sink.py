"""A local OTLP/HTTP receiver for the benchmark: accepts trace exports and throws them away.

So that "tracing on" is measured with the exporter production uses (OTLP over HTTP, protobuf,
batched off the event loop) without a collector: the sink reads each export, counts it, and
answers 200 with an empty ``ExportTraceServiceResponse`` (an empty protobuf message). Loopback
only; it runs on its own thread until closed.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OtlpSink:
    """``with OtlpSink() as sink:`` then point ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` at ``sink.url``."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(length)
                sink.exports += 1
                sink.bytes += length
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-sink", daemon=True)

    def __enter__(self) -> OtlpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
