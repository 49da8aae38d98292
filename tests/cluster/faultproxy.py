"""A fault-injecting HTTP front for the real kube-apiserver: what a client's handling of wire faults is tested on.

Like `kubectl proxy`, it serves plain HTTP on 127.0.0.1 and forwards each request to kube-apiserver over
TLS as the cluster's admin, or with the token of `identity` (a token kubeconfig, e.g.
`Kubeon.kubeconfig_of(api, service_account)`: the chart's RBAC then decides what gets through); a client
pointed at its `kubeconfig` talks to the real server through it. It
watches the traffic and, when a test asks, faults it at the points a real network or a restarting server
would, which nothing can schedule on purpose otherwise:

- `lists(path)`, `watches(path)`, `wait_for_watches(...)`: the list and watch requests made (a watch's
  `resourceVersion` is recorded when the request arrives, before anything is answered).
- `drop_watches()`: end every open watch stream (a terminating chunk, then the connection closed), as a
  load balancer's idle timeout or a server going away does: the client resumes from what it saw.
- `holding_watches()`: drop the open watches and keep new watch requests unanswered until the block
  ends, so changes made meanwhile reach no watch (with kube-apiserver restarted inside the block, the
  watch cache starts over above the client's resourceVersion and answers its watch 410 Gone).
- `answer_watches(code)`: answer the next watch with an HTTP error status instead of forwarding it
  (kube-apiserver v1.35 itself answers an expired watch with 200 and an ERROR event; other servers and
  proxies answer 410 as a status).
- `inject_line(path, line)`: write a raw line into the open watch stream of `path`, between events.
- `rewrite_lists(path, edit)`: pass list answers of `path` through `edit(bytes) -> bytes`.

Client connections are kept alive as kube-apiserver keeps them (kubernetes' `Watch.stop` shuts the socket
of a kept-alive connection; behind `Connection: close` the response owns it and a stop waits for the
watch's end); one upstream connection per request.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.control_plane import ControlPlane

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "accept-encoding",
               "proxy-connection", "te", "upgrade"}
HOLD_LIMIT = 120.0  # a held watch is let through after this long even if the test forgot to release it


def is_watch(query: dict[str, list[str]]) -> bool:
    return (query.get("watch") or [""])[0].lower() in ("true", "1")


@dataclass
class Stream:
    """One watch, from its admission to its end: the client's file once its headers went out, and the
    upstream socket to cut. Ended before its headers, it is answered as an empty watch."""

    path: str
    wfile: Any = None
    upstream: socket.socket | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    ended: bool = False

    def write_chunk(self, data: bytes) -> bool:
        """Send `data` as one HTTP chunk; False once the stream has ended or the client has gone."""
        with self.lock:
            if self.ended or self.wfile is None:
                return False
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                return True
            except OSError:
                self.ended = True
                return False

    def end(self) -> None:
        """The terminating chunk (when the headers went out), then the upstream cut so the relay stops."""
        with self.lock:
            if not self.ended:
                self.ended = True
                if self.wfile is not None:
                    with contextlib.suppress(OSError):
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
        if self.upstream is not None:
            with contextlib.suppress(OSError):
                self.upstream.shutdown(socket.SHUT_RDWR)


class FaultProxy:
    """Start with `start()` (or as a context manager); point clients at `kubeconfig`."""

    def __init__(self, plane: ControlPlane, root: Path, identity: Path | None = None) -> None:
        self.plane = plane
        self.root = root
        self.token = _token_of(identity) if identity else None
        self._cond = threading.Condition()
        self._lists: list[str] = []
        self._watches: list[tuple[str, str | None]] = []
        self._streams: list[Stream] = []
        self._holding = False
        self._answers: list[tuple[str | None, int]] = []
        self._rewrites: dict[str, Callable[[bytes], bytes]] = {}
        self.http_errors: list[int] = []  # statuses answered by `answer_watches`
        self._server: http.server.ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True).start()
        self._write_kubeconfig()
        return self

    def stop(self) -> None:
        with self._cond:
            self._holding = False
            self._cond.notify_all()
        self.drop_watches()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "proxy.kubeconfig"

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}]}))

    # ------------------------------------------------------------------ observing

    def lists(self, path: str) -> int:
        """How many list requests (a GET of `path` that is not a watch) have arrived."""
        with self._cond:
            return self._lists.count(path)

    def watches(self, path: str) -> list[str | None]:
        """The `resourceVersion` of every watch request on `path` (None when absent), oldest first."""
        with self._cond:
            return [rv for p, rv in self._watches if p == path]

    def wait_for_watches(self, path: str, count: int, timeout: float) -> bool:
        """Block until `path` has had `count` watch requests; woken by the request's arrival."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.watches(path)) >= count, timeout)

    def open_watches(self, path: str) -> int:
        with self._cond:
            return sum(1 for s in self._streams if s.path == path and not s.ended)

    # ------------------------------------------------------------------ faults

    def drop_watches(self) -> None:
        """End every open watch stream now."""
        with self._cond:
            streams = list(self._streams)
        for stream in streams:
            stream.end()

    @contextlib.contextmanager
    def holding_watches(self) -> Iterator[None]:
        """Drop the open watches; watch requests arriving in the block wait, unanswered, until it ends."""
        with self._cond:
            self._holding = True  # with admission under the same lock: a watch is admitted before (and
            streams = list(self._streams)  # ended here) or waits
        for stream in streams:
            stream.end()
        try:
            yield
        finally:
            with self._cond:
                self._holding = False
                self._cond.notify_all()

    def answer_watches(self, code: int, path: str | None = None, times: int = 1) -> None:
        """The next `times` watches (of `path`, or any) are answered with HTTP `code` and a Status."""
        with self._cond:
            self._answers.extend([(path, code)] * times)

    def inject_line(self, path: str, line: str, timeout: float = 30.0) -> None:
        """Write `line` into the open watch stream of `path` (waiting for one), between two events."""
        with self._cond:
            def stream() -> Stream | None:
                return next((s for s in reversed(self._streams)
                             if s.path == path and not s.ended and s.wfile is not None), None)

            found = self._cond.wait_for(stream, timeout)
            assert found, f"no open watch on {path} to inject into"
        assert found.write_chunk(line.encode() + b"\n"), f"the watch on {path} ended before the line went out"

    def rewrite_lists(self, path: str, edit: Callable[[bytes], bytes] | None) -> None:
        """List answers of `path` go through `edit` (None: unchanged again)."""
        with self._cond:
            if edit is None:
                self._rewrites.pop(path, None)
            else:
                self._rewrites[path] = edit

    # ------------------------------------------------------------------ called by the handler

    def _saw(self, path: str, query: dict[str, list[str]]) -> bool:
        """Record the request as it arrives; whether it is a watch."""
        watching = is_watch(query)
        with self._cond:
            if watching:
                self._watches.append((path, (query.get("resourceVersion") or [None])[0]))
                self._cond.notify_all()
            else:
                self._lists.append(path)
        return watching

    def _answer(self, path: str) -> int | None:
        """The status to answer a watch of `path` with instead of forwarding it, taken as it would be sent."""
        with self._cond:
            index = next((i for i, (p, _) in enumerate(self._answers) if p in (None, path)), None)
            if index is None:
                return None
            code = self._answers.pop(index)[1]
            self.http_errors.append(code)
            return code

    def _admit(self, path: str) -> Stream:
        """A watch let through (waiting while watches are held), registered so a drop ends it from now on."""
        with self._cond:
            self._cond.wait_for(lambda: not self._holding, HOLD_LIMIT)
            stream = Stream(path)
            self._streams.append(stream)
            self._cond.notify_all()
            return stream

    def _closed(self, stream: Stream) -> None:
        with self._cond:
            stream.ended = True
            if stream in self._streams:
                self._streams.remove(stream)

    def _rewrite(self, path: str) -> Callable[[bytes], bytes] | None:
        with self._cond:
            return self._rewrites.get(path)

    def _upstream(self, timeout: float | None) -> http.client.HTTPSConnection:
        context = (ssl.create_default_context(cafile=str(self.plane.pki["ca_crt"])) if self.token
                   else self.plane.ssl_context())
        return http.client.HTTPSConnection("127.0.0.1", self.plane.ports["apiserver"], context=context,
                                           timeout=timeout)


def _token_of(kubeconfig: Path) -> str:
    config = yaml.safe_load(kubeconfig.read_text())
    return str(config["users"][0]["user"]["token"])


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _forward(self) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(parsed.query)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if self.command != "GET" else b""
        if self.command == "GET" and self.owner._saw(parsed.path, query):
            stream = self.owner._admit(parsed.path)
            try:
                self._watch(parsed.path, query, stream)
            finally:
                self.owner._closed(stream)
            return
        try:
            upstream = self._request(body)
        except OSError as error:
            self._status(502, query, f"kube-apiserver unreachable: {error}")
            return
        try:
            self._relay_whole(parsed.path, upstream.getresponse(), rewrite=self.command == "GET")
        finally:
            upstream.close()

    def _request(self, body: bytes, timeout: float | None = 60) -> http.client.HTTPSConnection:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS | {"authorization"}}
        if self.owner.token:
            headers["Authorization"] = f"Bearer {self.owner.token}"
        upstream = self.owner._upstream(timeout)
        upstream.request(self.command, self.path, body=body or None, headers=headers)
        return upstream

    def _watch(self, path: str, query: dict[str, list[str]], stream: Stream) -> None:
        answer = self.owner._answer(path)
        if answer is not None:
            self._status(answer, query)
            return
        try:
            upstream = self._request(b"", timeout=None)
            response = upstream.getresponse()
        except OSError as error:
            self._status(502, query, f"kube-apiserver unreachable: {error}")
            return
        try:
            if response.status != 200:
                self._relay_whole(path, response, rewrite=False)
                return
            stream.upstream = upstream.sock
            with stream.lock:
                self._head(200, response.getheaders(), {"Transfer-Encoding": "chunked"})
                if stream.ended:  # dropped before it began: an empty watch
                    with contextlib.suppress(OSError):
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                    return
                stream.wfile = self.wfile
            self._relay_lines(response, stream)
        finally:
            upstream.close()

    def _head(self, status: int, headers: list[tuple[str, str]], extra: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers:
            if key.lower() not in HOP_HEADERS:
                self.send_header(key, value)
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()

    def _relay_whole(self, path: str, response: http.client.HTTPResponse, rewrite: bool) -> None:
        data = response.read()
        edit = self.owner._rewrite(path) if rewrite and response.status == 200 else None
        if edit is not None:
            data = edit(data)
        self._head(response.status, response.getheaders(), {"Content-Length": str(len(data))})
        with contextlib.suppress(OSError):
            self.wfile.write(data)
            self.wfile.flush()

    def _relay_lines(self, response: http.client.HTTPResponse, stream: Stream) -> None:
        with self.owner._cond:
            self.owner._cond.notify_all()  # the stream takes injected lines from now on
        while True:
            try:
                line = response.readline()
            except (OSError, http.client.HTTPException, ValueError):
                line = b""
            if not line:
                stream.end()  # the server ended the watch (its timeout) or was cut: end it for the client
                return
            if not stream.write_chunk(line):
                return

    def _status(self, code: int, query: dict[str, list[str]], message: str = "") -> None:
        reason = {410: "Expired", 429: "TooManyRequests", 500: "InternalError", 502: "BadGateway"}.get(code, "")
        rv = (query.get("resourceVersion") or ["0"])[0]
        text = message or (f"too old resource version: {rv}" if code == 410 else f"injected {code}")
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": text, "reason": reason, "code": code}).encode()
        self._head(code, [], {"Content-Type": "application/json", "Content-Length": str(len(body))})
        with contextlib.suppress(OSError):
            self.wfile.write(body)
            self.wfile.flush()
