"""A local Google Cloud for the GKE provider's tests: the few operations kube/gke.py calls, over HTTP.

Shaped from the published discovery documents: GKE `container` v1
(projects.locations.clusters.nodePools.list and .setSize, NodePool, Operation, the error body
`{"error": {"code", "message", "status"}}`) and Compute Engine v1 (instanceGroupManagers.get,
.listManagedInstances, .deleteInstances; InstanceGroupManager.targetSize, ManagedInstance.instance /
currentAction / instanceStatus, Operation). OAuth 2.0: `POST /token` answers a service account's JWT
grant (RFC 7523), and every API call must carry a Bearer credential (that token, or the key's
self-signed JWT google-auth may send instead), as Google's front end checks. A managed instance
group's instances follow its target size at once (setSize adds instances, deleteInstances removes
exactly the named ones and lowers the target size). `fault(method, path)` may
answer a call with an error first (throttling, a refusal); every call is recorded in `seen`.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "ya29.local-test-token"
COMPUTE = "https://www.googleapis.com/compute/v1"
Fault = Callable[[str, str], "tuple[int, dict[str, Any]] | None"]


def error(code: int, status: str, message: str) -> tuple[int, dict[str, Any]]:
    """Google's JSON error body (the discovery documents' common error shape)."""
    return code, {"error": {"code": code, "message": message, "status": status}}


@dataclass
class Pool:
    """A node pool and its one managed instance group in `zone`."""

    name: str
    machine_type: str
    labels: dict[str, str]
    zone: str
    autoscaling: bool = False
    target: int = 0
    instances: list[str] = field(default_factory=list)  # instance names, oldest first

    def group(self, project: str, cluster: str) -> str:
        return f"gke-{cluster}-{self.name}-grp"[:63]


class GoogleCloud:
    """Clusters and their node pools of one project, served over HTTP on 127.0.0.1."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.clusters: dict[tuple[str, str], dict[str, Pool]] = {}  # (location, cluster) -> pools
        self.fault: Fault = lambda method, path: None
        self.seen: list[tuple[str, str, float]] = []  # (method, path, when)
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- test side ----------------------------------------------------------------------------------
    def add_pool(self, location: str, cluster: str, pool: Pool) -> None:
        with self.lock:
            self.clusters.setdefault((location, cluster), {})[pool.name] = pool
            self._resize(cluster, pool, pool.target)

    def calls(self, method: str, suffix: str) -> list[float]:
        return [at for m, path, at in self.seen if m == method and path.endswith(suffix)]

    # -- the API ------------------------------------------------------------------------------------
    def _resize(self, cluster: str, pool: Pool, target: int) -> None:
        pool.target = target
        while len(pool.instances) < target:
            pool.instances.append(f"gke-{cluster}-{pool.name}-{uuid.uuid4().hex[:4]}"[-40:].lstrip("-"))
        del pool.instances[target:]

    def _find(self, location: str, cluster: str) -> dict[str, Pool] | None:
        return self.clusters.get((location, cluster))

    def _pool_json(self, cluster: str, pool: Pool) -> dict[str, Any]:
        group = f"{COMPUTE}/projects/{self.project}/zones/{pool.zone}/instanceGroupManagers/"
        return {"name": pool.name, "config": {"machineType": pool.machine_type, "labels": pool.labels},
                "initialNodeCount": 0, "autoscaling": {"enabled": pool.autoscaling} if pool.autoscaling else {},
                "instanceGroupUrls": [group + pool.group(self.project, cluster)], "locations": [pool.zone],
                "status": "RUNNING"}

    def _group(self, zone: str, name: str) -> tuple[str, Pool] | None:
        for (_, cluster), pools in self.clusters.items():
            for pool in pools.values():
                if pool.zone == zone and pool.group(self.project, cluster) == name:
                    return cluster, pool
        return None

    def answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        nodepools = re.fullmatch(r"/v1/projects/([^/]+)/locations/([^/]+)/clusters/([^/]+)/nodePools"
                                 r"(?:/([^/:]+):setSize)?", path)
        if nodepools and nodepools.group(1) == self.project:
            _, location, cluster, name = nodepools.groups()
            pools = self._find(location, cluster)
            if pools is None:
                return error(404, "NOT_FOUND", f"Not found: projects/{self.project}/locations/{location}/clusters/"
                                               f"{cluster}.")
            if method == "GET" and name is None:
                return 200, {"nodePools": [self._pool_json(cluster, p) for p in pools.values()]}
            if method == "POST" and name is not None:
                if name not in pools:
                    return error(404, "NOT_FOUND", f"Not found: node pool {name!r}.")
                self._resize(cluster, pools[name], int(body.get("nodeCount", body.get("node_count", 0))))
                return 200, {"name": f"operation-{uuid.uuid4().hex[:12]}", "zone": location,
                             "operationType": "SET_NODE_POOL_SIZE", "status": "RUNNING",
                             "targetLink": f"{path.split(':')[0]}"}
        group = re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instanceGroupManagers/([^/]+?)"
                             r"(/listManagedInstances|/deleteInstances)?", path)
        if group and group.group(1) == self.project:
            _, zone, name, verb = group.groups()
            found = self._group(zone, name)
            if found is None:
                return error(404, "NOT_FOUND", f"The resource 'projects/{self.project}/zones/{zone}/"
                                               f"instanceGroupManagers/{name}' was not found")
            cluster, pool = found
            base = f"{COMPUTE}/projects/{self.project}/zones/{zone}/instances/"
            if method == "GET" and verb is None:
                return 200, {"kind": "compute#instanceGroupManager", "name": name, "zone": zone,
                             "targetSize": pool.target, "baseInstanceName": f"gke-{cluster}-{pool.name}"}
            if method == "POST" and verb == "/listManagedInstances":
                return 200, {"managedInstances": [
                    {"instance": base + i, "id": str(abs(hash(i)) % 10**18), "currentAction": "NONE",
                     "instanceStatus": "RUNNING"} for i in pool.instances]}
            if method == "POST" and verb == "/deleteInstances":
                names = [str(u).rsplit("/", 1)[-1] for u in body.get("instances") or []]
                missing = [n for n in names if n not in pool.instances]
                if missing:
                    return error(400, "INVALID_ARGUMENT", f"The instance '{missing[0]}' is not a member of the "
                                                          f"managed instance group '{name}'.")
                pool.instances = [i for i in pool.instances if i not in names]
                pool.target -= len(names)
                return 200, {"kind": "compute#operation", "name": f"operation-{uuid.uuid4().hex[:12]}",
                             "operationType": "compute.instanceGroupManagers.deleteInstances", "status": "DONE"}
        return error(404, "NOT_FOUND", f"no such method: {method} {path}")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _any(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?", 1)[0]
                if path == "/token":  # the service account's JWT grant
                    self._reply(200, {"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"})
                    return
                cloud.seen.append((self.command, path, time.monotonic()))
                if not (self.headers.get("Authorization") or "").startswith("Bearer "):
                    self._reply(*error(401, "UNAUTHENTICATED", "Request is missing required authentication "
                                                               "credential."))
                    return
                answer = cloud.fault(self.command, path)
                if answer is None:
                    body = json.loads(raw or b"{}") if raw.strip() else {}
                    with cloud.lock:
                        answer = cloud.answer(self.command, path, body)
                self._reply(*answer)

            do_GET = do_POST = _any

        return Handler
