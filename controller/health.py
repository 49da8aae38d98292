"""The controller's small health server: /healthz, /readyz, /metrics on --health-port.

A stdlib ThreadingHTTPServer in a daemon thread is enough for three cheap GET
routes (the controller is not a request server). /readyz answers 200 once the
first policy sync has happened on the leader, or immediately on a standby
replica (it is ready to take over); /healthz is 200 while the process runs.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6  # an IPv6 --health-bind (`::` on an IPv6-only cluster)


class HealthServer:
    """Serves health and metrics; `port=0` picks a free port (see `.port`)."""

    def __init__(self, registry: CollectorRegistry, ready: Callable[[], bool], port: int = 8080,
                 bind: str = "0.0.0.0") -> None:
        self.registry = registry
        self.ready = ready
        handler = self._handler()
        self.server = (_Server6 if ":" in bind else ThreadingHTTPServer)((bind, port), handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        # A short poll interval: shutdown() waits for the serve loop's next poll (0.5 s by default).
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="health", daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    self._send(200, b"ok\n", "text/plain")
                elif path == "/readyz":
                    ok = outer.ready()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"not ready\n", "text/plain")
                elif path == "/metrics":
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                else:
                    self._send(404, b'{"message": "not found"}\n', "application/json")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
