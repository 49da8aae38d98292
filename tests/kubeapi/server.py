"""The HTTP face of the double: routes kube-apiserver URLs onto the registry, streams
watches as chunked newline-delimited JSON, and the `ApiServer` handle tests use.

Plain HTTP on 127.0.0.1 (no TLS, no authentication: the kubeconfig carries a
dummy token that is ignored). One thread per connection, so long-lived
watches do not block other requests.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.kubeapi import discovery, openapi, protobuf, status
from tests.kubeapi.admission import Admission
from tests.kubeapi.hooks import Hooks
from tests.kubeapi.logs import PodLogs
from tests.kubeapi.registry import Options, Registry, present
from tests.kubeapi.resources import Catalog, Resource
from tests.kubeapi.selectors import match_fields, match_requirements, parse_fields, parse_labels
from tests.kubeapi.status import ApiError
from tests.kubeapi.store import Event, Gone, Store

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
DEFAULT_WATCH_SECONDS = 1800


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer
    timeout = 300  # idle keep-alive connections close after this

    def log_message(self, format: str, *args: Any) -> None:
        if os.environ.get("KUBEAPI_LOG"):
            sys.stderr.write("kubeapi: " + (format % args) + "\n")

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle stalls
        self.server.connections.add(self.connection)

    def finish(self) -> None:
        self.server.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # dispatch -----------------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        opts = Options()
        try:
            url = urlsplit(self.path)
            if method != "GET":
                self.server.writes.append((method, url.path))
            query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            opts.dry_run = query.get("dryRun") == "All"
            if query.get("dryRun") not in (None, "", "All"):
                raise status.bad_request(f'dryRun: Unsupported value: "{query["dryRun"]}": supported values: "All"')
            opts.field_validation = query.get("fieldValidation") or "Warn"
            opts.field_manager = query.get("fieldManager", "")
            opts.force = query.get("force") in ("true", "1")
            opts.user_agent = self.headers.get("User-Agent", "")
            code, body = self._route(method, url.path, query, raw, opts)
            if body is not None:
                self._send(code, body, opts.warnings)
        except ApiError as err:
            self._send(err.code, err.status(), opts.warnings)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the double: answer like the apiserver, log for the test
            traceback.print_exc()
            self._send(500, status.internal(f"test API server: {type(exc).__name__}: {exc}").status(), [])

    def _route(self, method: str, path: str, query: dict[str, str], raw: bytes,
               opts: Options) -> tuple[int, Any]:
        srv = self.server
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] in ("healthz", "readyz", "livez"):
            return 200, "ok"
        if method == "GET":
            doc = self._discovery(parts)
            if doc is not None:
                return 200, doc
        if parts[0] == "api" and len(parts) >= 3 and parts[1] == "v1":
            group, version, rest = "", "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        watch = query.get("watch") in ("true", "1")
        if rest[0] == "watch":
            watch, rest = True, rest[1:]
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (group == "" and len(rest) == 3
                                                               and rest[2] in ("status", "finalize")):
            ns, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else "")
        res = srv.catalog.lookup(group, version, plural)
        if res is None or len(rest) > 3 or (sub and sub not in res.subresources) or \
                (ns is not None and not res.namespaced) or (name is not None and res.namespaced and ns is None):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        reg = srv.registry
        body = self._body(raw, res, sub) if raw and method in ("POST", "PUT", "DELETE") else None
        nsname = ns or ""
        if method == "GET":
            if name is None and watch:
                self._watch(res, ns, query)
                return 200, None
            if name is None:
                srv.hooks.saw_list(path)
                result = reg.list(res, ns, query.get("labelSelector"), query.get("fieldSelector"))
                if srv.hooks.bare_list_items and not res.custom:
                    result["items"] = [{k: v for k, v in item.items() if k not in ("apiVersion", "kind")}
                                       for item in result["items"]]
            elif sub == "scale":
                return 200, reg.get_scale(res, nsname, name)
            elif sub == "log":
                return 200, srv.logs.read(reg.get(res, nsname, name), query)
            else:
                result = reg.get(res, nsname, name)
                srv.hooks.after_read(path, res, nsname, name)
            return 200, self._maybe_table(res, result, query)
        if method == "POST" and name is None:
            return 201, reg.create(res, nsname, body, opts)
        if method == "POST" and sub == "binding":
            return 201, reg.bind(nsname, name or "", body, opts)
        if method == "POST" and sub == "eviction":
            return 201, reg.evict(nsname, name or "", body, opts)
        if method == "PUT" and name is not None:
            if sub == "scale":
                return 200, reg.update_scale(res, nsname, name, body, None, opts)
            return 200, reg.update(res, nsname, name, body, opts, "status" if sub == "status" else "")
        if method == "PATCH" and name is not None:
            ctype = self.headers.get("Content-Type", "")
            if sub == "scale":
                return 200, reg.update_scale(res, nsname, name, raw, ctype, opts)
            patched = reg.patch(res, nsname, name, raw, ctype, opts, sub)
            return (201 if opts.created else 200), patched
        if method == "DELETE" and name is not None and not sub:
            return reg.delete(res, nsname, name, body, opts)[::-1]
        if method == "DELETE" and name is None:
            listed = reg.list(res, ns, query.get("labelSelector"), query.get("fieldSelector"))
            for item in listed["items"]:
                reg.delete(res, item["metadata"].get("namespace", ""), item["metadata"]["name"], body, opts)
            return 200, listed
        raise status.method_not_allowed()

    def _body(self, raw: bytes, res: Resource, sub: str) -> Any:
        """The request body as a JSON value: JSON, or the protobuf envelope typed clients send."""
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype != protobuf.MEDIA:
            return _json(raw)
        api_version, kind = res.api_version, res.kind
        if self.command == "DELETE":
            api_version, kind = "meta.k8s.io/v1", "DeleteOptions"
        elif sub in _SUB_KINDS:
            api_version, kind = _SUB_KINDS[sub]
        return protobuf.decode(raw, api_version, kind)

    def _discovery(self, parts: list[str]) -> Any:
        catalog = self.server.catalog
        if parts == ["version"]:
            return discovery.VERSION
        if parts == ["api"]:
            return discovery.api_versions(f"127.0.0.1:{self.server.server_address[1]}")
        if parts == ["api", "v1"]:
            return discovery.resource_list(catalog, "", "v1")
        if parts == ["apis"]:
            return discovery.api_groups(catalog)
        if parts[0] == "apis" and len(parts) == 2:
            return discovery.api_group(catalog, parts[1]) or _not_found()
        if parts[0] == "apis" and len(parts) == 3:
            return discovery.resource_list(catalog, parts[1], parts[2]) or _not_found()
        if parts == ["openapi", "v3"]:
            return openapi.root(catalog)
        if parts[:2] == ["openapi", "v3"]:
            rest = parts[2:]
            if rest[:1] == ["api"] and len(rest) == 2:
                return openapi.group_version(catalog, "", rest[1]) or _not_found()
            if rest[:1] == ["apis"] and len(rest) == 3:
                return openapi.group_version(catalog, rest[1], rest[2]) or _not_found()
            return _not_found()
        if parts[0] in ("openapi", "swagger.json", "swagger-2.0.0.pb-v1"):
            return _not_found()
        return None

    def _maybe_table(self, res: Resource, result: dict[str, Any], query: dict[str, str]) -> dict[str, Any]:
        accept = self.headers.get("Accept", "")
        if "as=Table" in accept:
            return discovery.table(res, result, query.get("includeObject", "PartialObjectMetadata"))
        return result

    # responses ----------------------------------------------------------------------------------
    def _send(self, code: int, body: Any, warnings: list[str]) -> None:
        ctype, data = "application/json", None
        if isinstance(body, str):
            ctype, data = "text/plain", body.encode()
        elif isinstance(body, dict) and protobuf.wants_protobuf(self.headers.get("Accept", "")):
            data = protobuf.encode(body)
            ctype = protobuf.MEDIA if data is not None else ctype
        if data is None:
            data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for text in dict.fromkeys(warnings):
            self.send_header("Warning", '299 - "' + text.replace('"', '\\"') + '"')
        self.end_headers()
        self.wfile.write(data)

    def _watch(self, res: Resource, ns: str | None, query: dict[str, str]) -> None:
        store, hooks = self.server.store, self.server.hooks
        ticket = hooks.saw_watch(urlsplit(self.path).path, query.get("resourceVersion"))
        labels = parse_labels(query.get("labelSelector"))
        fields = parse_fields(query.get("fieldSelector"), res.key)
        rv = query.get("resourceVersion") or ""
        timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        initial: list[dict[str, Any]] = []
        send_initial = query.get("sendInitialEvents") == "true"
        if rv in ("", "0") or send_initial:
            initial, since = store.list(res.key, ns)
        elif rv.isdigit():
            since = int(rv)
            hooks.refuse_gone(since)
        else:
            raise status.bad_request(f'resourceVersion: Invalid value: "{rv}": must be a number')

        def matches(obj: dict[str, Any] | None) -> bool:
            return obj is not None and match_requirements(labels, obj["metadata"].get("labels")) \
                and match_fields(fields, obj)

        proto = protobuf.wants_protobuf(self.headers.get("Accept", "")) and \
            protobuf.message_name(res.api_version, res.kind) is not None
        self.send_response(200)
        self.send_header("Content-Type", protobuf.WATCH_MEDIA if proto else "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.close_connection = True
        try:
            for obj in initial:
                if matches(obj):
                    self._chunk({"type": "ADDED", "object": present(res, obj)}, proto)
            if send_initial:  # watch-list (client-go's WatchListClient): a bookmark ends the initial events
                self._chunk({"type": "BOOKMARK", "object": {
                    "apiVersion": res.api_version, "kind": res.kind, "metadata": {
                        "resourceVersion": str(since), "annotations": {"k8s.io/initial-events-end": "true"}}}},
                    proto)
            for event in store.events_since(res.key, ns, since, timeout,
                                            lambda: not self.server.stopping and not hooks.dropped(ticket)
                                            and not hooks.expired(ticket)):
                if event.raw is not None:
                    if not proto:
                        self._raw_chunk(event.raw + b"\n")
                    continue
                kind = _transition(event, matches)
                if kind:
                    self._chunk({"type": kind, "object": present(res, event.obj)}, proto)
            if hooks.expired(ticket) and not hooks.dropped(ticket):
                raise Gone(f"too old resource version: {since} ({store.revision})")
        except Gone as gone:
            if not hooks.dropped(ticket):  # a dropped watch ends as a closed connection, even if expired since
                self._chunk({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                         "status": "Failure", "message": str(gone),
                                                         "reason": "Expired", "code": 410}}, proto)
        except OSError:
            return
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass

    def _chunk(self, event: dict[str, Any], proto: bool = False) -> None:
        envelope = protobuf.encode(event["object"]) if proto else None
        if envelope is not None:
            data = protobuf.watch_frame(event["type"], envelope)
        else:
            data = json.dumps(event).encode() + b"\n"
        self._raw_chunk(data)

    def _raw_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


# Bodies of the POST subresources, by subresource.
_SUB_KINDS = {"eviction": ("policy/v1", "Eviction"), "binding": ("v1", "Binding"), "scale": ("autoscaling/v1", "Scale")}


def _transition(event: Event, matches: Any) -> str | None:
    """Selector-filtered watch: objects entering the selection are ADDED, leaving it DELETED."""
    now_in = matches(event.obj)
    if event.type != "MODIFIED":
        return event.type if now_in else None
    was_in = matches(event.prev)
    if now_in and was_in:
        return "MODIFIED"
    if now_in:
        return "ADDED"
    return "DELETED" if was_in else None


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # Go's encoding/json: "cannot unmarshal number 1e999 ... value out of range"
        raise ValueError(f"number {text} out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"invalid character in numeric literal: {name}")  # NaN and Infinity are not JSON


def _json(raw: bytes) -> Any:
    """The body as JSON, refused as kube-apiserver refuses it: Python's json would also read NaN, Infinity
    and 1e999 (an infinite float), which this server would then write back as `Infinity`, not JSON."""
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except ValueError as exc:
        raise status.bad_request(f"error decoding request body as JSON: {exc}") from None


def _not_found() -> None:
    raise ApiError(404, "NotFound", "the server could not find the requested resource")


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, registry: Registry, port: int = 0) -> None:
        self.registry = registry
        self.store = registry.store
        self.catalog = registry.catalog
        self.connections: set[socket.socket] = set()
        self.stopping = False
        self.logs = PodLogs()
        self.hooks = Hooks(self.store, self.catalog)  # test controls (hooks.py): inert until a test uses one
        # (method, path) of every request but GETs, in arrival order: what a client wrote, for tests
        # that check it stayed within an RBAC grant (ApiServer.writes).
        self.writes: list[tuple[str, str]] = []
        super().__init__(("127.0.0.1", port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client dropping its keep-alive connection is not an error worth a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class ApiServer:
    """An in-process Kubernetes API server for tests. Start with `ApiServer.start()`."""

    def __init__(self, history: int = 2000, port: int = 0) -> None:
        self.store = Store(history=history)
        self.catalog = Catalog()
        self.services: dict[tuple[str, str, int], str] = {}
        self.admission = Admission(self.store, lambda ns, name, port: self.services.get((ns, name, port)))
        self.registry = Registry(self.store, self.catalog, self.admission)
        self._http = _HttpServer(self.registry, port)
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"kubeapi-{self.port}", daemon=True)
        self._dir = Path(tempfile.mkdtemp(prefix="kubeapi-"))
        self.kubeconfig = str(self._dir / "kubeconfig")
        Path(self.kubeconfig).write_text(self._kubeconfig_text())
        for ns in DEFAULT_NAMESPACES:
            self.registry.create(self._res("", "v1", "namespaces"), "", {"metadata": {"name": ns}}, Options())

    @property
    def writes(self) -> list[tuple[str, str]]:
        """(method, path) of every non-GET request so far (POST, PUT, PATCH, DELETE), oldest first."""
        return list(self._http.writes)

    @classmethod
    def start(cls, crd_files: list[str | Path] | tuple[str | Path, ...] = (), history: int = 2000,
              port: int = 0) -> ApiServer:
        """Bind 127.0.0.1 on `port` (0: a free one), serve in a background thread, install the given CRDs."""
        server = cls(history=history, port=port)
        server._thread.start()
        for path in crd_files:
            server.install_crd(path)
        return server

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _kubeconfig_text(self) -> str:
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kubeapi",
            "clusters": [{"name": "kubeapi", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "kubeapi-test-token"}}],
            "contexts": [{"name": "kubeapi", "context": {"cluster": "kubeapi", "user": "test",
                                                        "namespace": "default"}}],
        }, indent=2)

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient pointed at this server (imports the client lazily)."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        config.api_key = {"authorization": "kubeapi-test-token"}
        config.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(config)

    def install_crd(self, crd: str | Path | dict[str, Any]) -> dict[str, Any]:
        """Create a CustomResourceDefinition from a YAML/JSON path or a dict; returns the stored CRD."""
        docs: list[Any]
        if isinstance(crd, dict):
            docs = [crd]
        else:
            import yaml

            docs = [d for d in yaml.safe_load_all(Path(crd).read_text()) if d]
        created = {}
        for doc in docs:
            created = self.registry.create(self._res("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
                                           "", doc, Options())
        return created

    def map_service(self, namespace: str, name: str, url: str, port: int = 443) -> None:
        """Resolve webhook `clientConfig.service` {namespace, name, port} to a local base URL."""
        self.services[(namespace, name, port)] = url

    @property
    def hooks(self) -> Hooks:
        """Test hooks (hooks.py): count list/watch requests, wait for a watch request, drop or expire open
        watches, answer 410 as an HTTP status, inject raw watch lines, force write conflicts."""
        return self._http.hooks

    @property
    def logs(self) -> PodLogs:
        """Pod logs: `api.logs.write(namespace, pod, text_or_path, container="")`."""
        return self._http.logs

    def compact(self) -> None:
        """Forget the watch history: watches from older resourceVersions get 410 Gone."""
        self.store.compact()

    def stop(self) -> None:
        self._http.stopping = True
        self.store.close()
        self._http.shutdown()
        for conn in list(self._http.connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._http.server_close()
        self._thread.join(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _res(self, group: str, version: str, plural: str) -> Resource:
        res = self.catalog.lookup(group, version, plural)
        assert res is not None
        return res

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
