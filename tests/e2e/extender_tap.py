"""A recording HTTP proxy between kube-scheduler and the extender: what the real scheduler sends.

kube-scheduler's extender calls (/filter, /prioritize, /bind) go through it unchanged and are kept
as (verb, JSON body), so a test can check the wire format the real kube-scheduler v1.35 uses with
the chart's KubeSchedulerConfiguration (nodeCacheCapable: NodeNames, never Nodes; bindVerb:
ExtenderBindingArgs) without trusting a stand-in's idea of it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests


class _Record(BaseHTTPRequestHandler):
    server: ExtenderTap
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.record(self.path.rsplit("/", 1)[-1], json.loads(body or b"null"))
        upstream = self.server.session.post(self.server.upstream + self.path, data=body, timeout=30,
                                            headers={"Content-Type": self.headers.get("Content-Type", "")})
        self.send_response(upstream.status_code)
        self.send_header("Content-Type", upstream.headers.get("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(upstream.content)))
        self.end_headers()
        self.wfile.write(upstream.content)

    def log_message(self, *_: object) -> None:
        pass


class ExtenderTap(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Record)
        self.upstream = upstream
        self.session = requests.Session()
        self.session.trust_env = False  # loopback: no proxy from the environment
        self.calls: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def record(self, verb: str, args: Any) -> None:
        with self._lock:
            self.calls.append((verb, args))

    def since(self, mark: int) -> list[tuple[str, Any]]:
        with self._lock:
            return list(self.calls[mark:])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.session.close()
