"""The cluster's way out to the internet, for processes run in place of pods, and its Service
network, for kube-apiserver: an HTTP CONNECT proxy that sends named hosts (`acme.kubeon.io:443`,
`kubeon-gpu-optimizer-webhook.kubeon-gpu.svc:443`) to local servers.

Processes get it as HTTPS_PROXY (requests honours it; NO_PROXY keeps 127.0.0.1 direct), so a
component configured with the README's public URL reaches a local stand-in over TLS end to end:
the proxy only pipes bytes, the certificate is the stand-in's for that name. Unknown hosts get
502 (there is no internet here).
"""

from __future__ import annotations

import contextlib
import select
import socket
import socketserver
import threading
from typing import Any


class _Tunnel(socketserver.StreamRequestHandler):
    server: Egress

    def handle(self) -> None:
        line = self.rfile.readline(65537).decode("latin-1").split()
        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
            pass
        target = self.server.routes.get(line[1]) if len(line) == 3 and line[0] == "CONNECT" else None
        if target is None:
            self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        with socket.create_connection(target, timeout=10) as upstream:
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            self._pipe(self.connection, upstream)

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        while True:
            ready, _, _ = select.select([a, b], [], [], 30)
            if not ready:
                return
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                (b if sock is a else a).sendall(data)


class Egress(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, routes: dict[str, tuple[str, int]]) -> None:
        self.routes = routes  # "host:port" -> local (address, port)
        super().__init__(("127.0.0.1", 0), _Tunnel)
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    @property
    def env(self) -> dict[str, str]:
        url = f"http://127.0.0.1:{self.server_address[1]}"
        return {"HTTPS_PROXY": url, "https_proxy": url, "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost"}

    def close(self, *_: Any) -> None:
        with contextlib.suppress(OSError):
            self.shutdown()
        self.server_close()
