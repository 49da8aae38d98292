"""A plain-HTTP proxy in front of the real kube-apiserver, for wire faults a test must cause.

Every request is forwarded as is over TLS with the cluster's admin certificate, and recorded
(method, path, status). `after_read(method, path)` runs once a response has come back from the API
server and before it is passed on: a test uses it to let another writer change the object the
client has just read, so the client's next write meets a newer resourceVersion (a real conflict,
answered by the real server). Clients use `kubeconfig`, which names no user: the proxy authenticates.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
import yaml

from tests.cluster.cluster import Cluster

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-encoding", "content-length", "host"}


class _Forward(BaseHTTPRequestHandler):
    server: ApiProxy
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
        upstream = self.server.session.request(self.command, self.server.upstream + self.path, headers=headers,
                                               data=body or None, timeout=60, verify=self.server.ca)
        self.server.record(self.command, self.path.split("?", 1)[0], upstream.status_code)
        self.server.after_read(self.command, self.path.split("?", 1)[0])
        self.send_response(upstream.status_code)
        for key, value in upstream.headers.items():
            if key.lower() not in HOP_HEADERS:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(upstream.content)))
        self.end_headers()
        self.wfile.write(upstream.content)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, *_: object) -> None:
        pass


class ApiProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cluster: Cluster, after_read: Callable[[str, str], None] = lambda method, path: None) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        pki = cluster.plane.pki
        self.upstream = cluster.url
        self.session = requests.Session()
        self.session.cert = (str(pki["admin_crt"]), str(pki["admin_key"]))
        self.session.trust_env = False  # no proxy or CA bundle from the environment: straight to the API server
        self.ca = str(pki["ca_crt"])
        self.after_read = after_read
        self.seen: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.seen.append((method, path, status))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}]}))
        return path

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.session.close()
