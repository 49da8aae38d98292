"""A wire-level fake of the Kubernetes list/watch protocol, stdlib only.

Serves `GET <collection>` (a List with metadata.resourceVersion) and
`GET <collection>?watch=true&resourceVersion=N` (newline-delimited JSON
events, connection-delimited, like kube-apiserver). Tests drive it: add,
modify and delete objects (logged as events), change state silently (as if
the history was compacted), expire watches with a 410 ERROR event or an HTTP
410, drop watch connections, inject garbage lines.

It exists so the reflector can be tested before the shared test API server
(tests/kubeapi/) exists; it implements only what a reflector uses.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonpatch
import jsonpointer

COLLECTIONS = {
    "/api/v1/nodes": ("v1", "NodeList"),
    "/apis/gpu.kubeon.io/v1alpha1/gpupolicies": ("gpu.kubeon.io/v1alpha1", "GpuPolicyList"),
}


class FakeKubeApi:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.rv = 100
        self.floor = 0  # watches from a resourceVersion below this get 410
        self.gone_as_http = False
        self.objects: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in COLLECTIONS}
        self.events: dict[str, list[tuple[int, str]]] = {p: [] for p in COLLECTIONS}  # (rv, line)
        self.generation = 0  # bumped to end every open watch
        self.expire_generation = 0  # bumped to send 410 to every open watch
        self.watch_requests: list[str | None] = []
        self.list_requests = 0
        # Single objects served by GET, replaced by PUT (409 on a stale resourceVersion)
        # or JSON-patched (422 when a `test` op fails); `concurrent_writes` makes the next
        # N reads be followed by another writer's update, so the reader's write conflicts.
        self.singletons: dict[str, dict[str, Any]] = {}
        self.concurrent_writes = 0
        self.puts = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeKubeApi:
        self.thread.start()
        return self

    def close(self) -> None:
        self.drop_watches()
        self.server.shutdown()
        self.server.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        }))
        return path

    # ---- state changes ----------------------------------------------------
    def _set(self, coll: str, obj: dict[str, Any], kind: str | None, log: bool = True) -> None:
        with self._cond:
            self.rv += 1
            obj = json.loads(json.dumps(obj))
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                self.objects[coll].pop(name, None)
            else:
                self.objects[coll][name] = obj
            if log and kind:
                self.events[coll].append((self.rv, json.dumps({"type": kind, "object": obj})))
            self._cond.notify_all()

    def add(self, coll: str, obj: dict[str, Any]) -> None:
        self._set(coll, obj, "ADDED")

    def modify(self, coll: str, obj: dict[str, Any]) -> None:
        self._set(coll, obj, "MODIFIED")

    def delete(self, coll: str, name: str) -> None:
        self._set(coll, self.objects[coll][name], "DELETED")

    def add_silently(self, coll: str, obj: dict[str, Any]) -> None:
        self._set(coll, obj, "ADDED", log=False)

    def delete_silently(self, coll: str, name: str) -> None:
        self._set(coll, self.objects[coll][name], "DELETED", log=False)

    def inject_line(self, coll: str, line: str) -> None:
        with self._cond:
            self.rv += 1
            self.events[coll].append((self.rv, line))
            self._cond.notify_all()

    def expire(self) -> None:
        """Compact history: every open watch gets 410 and older resourceVersions are gone."""
        with self._cond:
            self.floor = self.rv
            self.expire_generation += 1
            self._cond.notify_all()

    def drop_watches(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    # ---- HTTP -------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # watches are chunked, one event per chunk, like kube-apiserver

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                if parts.path in fake.singletons:
                    with fake._cond:
                        body = json.loads(json.dumps(fake.singletons[parts.path]))
                        if fake.concurrent_writes > 0:
                            fake.concurrent_writes -= 1
                            fake.rv += 1
                            fake.singletons[parts.path]["metadata"]["resourceVersion"] = str(fake.rv)
                    self._json(200, body)
                elif parts.path not in COLLECTIONS:
                    self._json(404, {"kind": "Status", "code": 404, "message": "not found"})
                elif query.get("watch") in ("true", "1"):
                    self._watch(parts.path, query)
                else:
                    self._list(parts.path)

            def do_PUT(self) -> None:
                path = urlsplit(self.path).path
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with fake._cond:
                    fake.puts += 1
                    current = fake.singletons.get(path)
                    if current is None:
                        self._json(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                        return
                    if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                        self._json(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
                        return
                    fake.rv += 1
                    body["metadata"]["resourceVersion"] = str(fake.rv)
                    fake.singletons[path] = body
                self._json(200, body)

            def do_PATCH(self) -> None:
                """JSON Patch (RFC 6902) on a singleton; a failed `test` op is a 422, as kube-apiserver answers."""
                path = urlsplit(self.path).path
                ops = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if self.headers.get("Content-Type", "").split(";")[0] != "application/json-patch+json":
                    self._json(415, {"kind": "Status", "code": 415, "reason": "UnsupportedMediaType"})
                    return
                with fake._cond:
                    fake.puts += 1
                    current = fake.singletons.get(path)
                    if current is None:
                        self._json(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                        return
                    try:
                        body = jsonpatch.apply_patch(current, ops)
                    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                        self._json(422, {"kind": "Status", "code": 422, "reason": "Invalid", "message": str(exc)})
                        return
                    fake.rv += 1
                    body["metadata"]["resourceVersion"] = str(fake.rv)
                    fake.singletons[path] = body
                self._json(200, body)

            def _json(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _list(self, coll: str) -> None:
                api_version, kind = COLLECTIONS[coll]
                with fake._cond:
                    fake.list_requests += 1
                    items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                             for o in fake.objects[coll].values()]
                    rv = str(fake.rv)
                self._json(200, {"kind": kind, "apiVersion": api_version,
                                 "metadata": {"resourceVersion": rv}, "items": items})

            def _watch(self, coll: str, query: dict[str, str]) -> None:
                since = int(query.get("resourceVersion") or 0)
                timeout = min(float(query.get("timeoutSeconds") or 30), 30)
                gone = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                    "reason": "Expired", "code": 410,
                                                    "message": "too old resource version"}}
                with fake._cond:
                    fake.watch_requests.append(query.get("resourceVersion"))
                    too_old = since < fake.floor
                    # the generations this watch answers to, read with `too_old`: an expiry or drop that
                    # lands while the headers go out must still end this watch (it raced the test before)
                    started = (fake.generation, fake.expire_generation)
                if too_old and fake.gone_as_http:
                    self._json(410, gone["object"])
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.close_connection = True
                try:
                    self._stream(coll, since, timeout, gone, too_old, started)
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass  # the client went away

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _stream(self, coll: str, since: int, timeout: float, gone: dict, too_old: bool,
                        started: tuple[int, int]) -> None:
                generation, expire_gen = started
                if too_old:
                    self._chunk(json.dumps(gone).encode() + b"\n")
                    return
                deadline = time.monotonic() + timeout
                sent = since
                while True:
                    with fake._cond:
                        lines = [(rv, ln) for rv, ln in fake.events[coll] if rv > sent]
                        if not lines:
                            if fake.generation != generation:
                                return
                            if fake.expire_generation != expire_gen:
                                self._chunk(json.dumps(gone).encode() + b"\n")
                                return
                            remaining = deadline - time.monotonic()
                            if remaining <= 0:
                                return
                            fake._cond.wait(min(remaining, 0.5))
                            continue
                    for rv, line in lines:
                        self._chunk(line.encode() + b"\n")
                        sent = rv

        return Handler
