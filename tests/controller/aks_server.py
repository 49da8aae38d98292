"""A local Azure Resource Manager for the AKS provider's tests: the few operations kube/aks.py calls, over HTTPS.

Shaped from azure-rest-api-specs, specification/containerservice, Microsoft.ContainerService managedClusters
API version 2026-08-01 (the version kube/aks.py sets on its client, `API_VERSION`, and this server requires;
azure-mgmt-containerservice 41.9.0 would otherwise call 2026-09-01): agentPools list / get / createOrUpdate
(200, the pool; its count followed at once by machines), agentPools deleteMachines (202: exactly the named
machines go and the count drops), machines list (each machine's `properties.resourceId`, its VMSS VM), and
ARM's error body `{"error": {"code", "message"}}`. The managed identity token endpoint (App Service,
api-version 2019-08-01: `IDENTITY_ENDPOINT`, header `X-IDENTITY-HEADER`) hands out the Bearer token every ARM
call must carry. TLS: ARM is HTTPS only and azure-core sends no Bearer token over plain HTTP; the certificate
is signed by a CA the test makes. `fault(method, path)` may answer a call with an error first; every ARM call
is recorded in `seen`.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

API_VERSION = "2026-08-01"
TOKEN = "eyJ0eXAiOiJKV1QiLCJhbGciOiJub25lIn0.local.test"
IDENTITY_HEADER = "local-identity-header"
Answer = tuple[int, dict[str, Any], dict[str, str]]
Fault = Callable[[str, str], "Answer | None"]


def error(code: int, arm_code: str, message: str, headers: dict[str, str] | None = None) -> Answer:
    return code, {"error": {"code": arm_code, "message": message}}, headers or {}


@dataclass
class AgentPool:
    """An agent pool: its VM size, node labels, count and machines (VMSS instances)."""

    name: str
    vm_size: str
    labels: dict[str, str]
    count: int = 0
    autoscaling: bool = False
    machines: dict[str, int] = field(default_factory=dict)  # machine name -> VMSS instance id
    made: int = 0

    def resource_id(self, subscription: str, group: str, cluster: str, instance: int) -> str:
        return (f"/subscriptions/{subscription}/resourceGroups/MC_{group}_{cluster}_eastus/providers/"
                f"Microsoft.Compute/virtualMachineScaleSets/aks-{self.name}-12345678-vmss/virtualMachines/{instance}")


class AzureCloud:
    """Managed clusters and their agent pools of one subscription, served over HTTPS on 127.0.0.1."""

    def __init__(self, subscription: str, cert: Path, key: Path, ca: Path) -> None:
        self.subscription, self.ca = subscription, ca  # ca: what clients trust the certificate by
        self.clusters: dict[tuple[str, str], dict[str, AgentPool]] = {}  # (resource group, cluster) -> pools
        self.fault: Fault = lambda method, path: None
        self.seen: list[tuple[str, str, float]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_pool(self, group: str, cluster: str, pool: AgentPool) -> None:
        with self.lock:
            self.clusters.setdefault((group, cluster), {})[pool.name] = pool
            self._scale(pool, pool.count)

    def calls(self, method: str, suffix: str) -> list[float]:
        return [at for m, path, at in self.seen if m == method and path.endswith(suffix)]

    def _scale(self, pool: AgentPool, count: int) -> None:
        pool.count = count
        while len(pool.machines) < count:
            pool.machines[f"aks-{pool.name}-12345678-vmss{pool.made:06x}"] = pool.made
            pool.made += 1
        for name in list(pool.machines)[count:]:
            del pool.machines[name]

    def _pool_json(self, group: str, cluster: str, pool: AgentPool) -> dict[str, Any]:
        base = (f"/subscriptions/{self.subscription}/resourceGroups/{group}/providers/"
                f"Microsoft.ContainerService/managedClusters/{cluster}/agentPools/{pool.name}")
        return {"id": base, "name": pool.name, "type": "Microsoft.ContainerService/managedClusters/agentPools",
                "properties": {"count": pool.count, "vmSize": pool.vm_size, "nodeLabels": pool.labels,
                               "enableAutoScaling": pool.autoscaling, "mode": "User", "osType": "Linux",
                               "type": "VirtualMachineScaleSets", "provisioningState": "Succeeded"}}

    def answer(self, method: str, path: str, body: dict[str, Any]) -> Answer:
        found = re.fullmatch(r"/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.ContainerService/"
                             r"managedClusters/([^/]+)/agentPools(?:/([^/]+))?(/machines|/deleteMachines)?", path)
        if not found or found.group(1) != self.subscription:
            return error(404, "InvalidResourceType", f"no such resource type: {path}")
        _, group, cluster, name, verb = found.groups()
        pools = self.clusters.get((group, cluster))
        if pools is None:
            return error(404, "ResourceNotFound", f"The Resource 'Microsoft.ContainerService/managedClusters/"
                                                  f"{cluster}' under resource group '{group}' was not found.")
        if name is None:
            return 200, {"value": [self._pool_json(group, cluster, p) for p in pools.values()]}, {}
        pool = pools.get(name)
        if pool is None:
            return error(404, "NotFound", f"Agent pool '{name}' of managed cluster '{cluster}' was not found.")
        if method == "GET" and verb is None:
            return 200, self._pool_json(group, cluster, pool), {}
        if method == "PUT" and verb is None:
            self._scale(pool, int(body["properties"]["count"]))
            return 200, self._pool_json(group, cluster, pool), {}
        if method == "GET" and verb == "/machines":
            return 200, {"value": [{"name": m, "properties": {"resourceId": pool.resource_id(
                self.subscription, group, cluster, i)}} for m, i in pool.machines.items()]}, {}
        if method == "POST" and verb == "/deleteMachines":
            names = list(body.get("machineNames") or [])
            missing = [n for n in names if n not in pool.machines]
            if missing:
                return error(400, "InvalidParameter", f"machine {missing[0]} is not in agent pool {name}")
            for n in names:
                del pool.machines[n]
            pool.count -= len(names)
            return 202, {}, {"Location": f"{self.url}/operationresults/1"}
        return error(405, "MethodNotAllowed", f"{method} {path}")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(body).encode() if body or code != 202 else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _any(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                if url.path == "/msi/token":  # App Service managed identity, api-version 2019-08-01
                    if self.headers.get("X-IDENTITY-HEADER") != IDENTITY_HEADER:
                        self._reply(400, {"error": "bad identity header"}, {})
                        return
                    self._reply(200, {"access_token": TOKEN, "expires_on": str(int(time.time()) + 3600),
                                      "resource": query.get("resource", [""])[0], "token_type": "Bearer"}, {})
                    return
                cloud.seen.append((self.command, url.path, time.monotonic()))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._reply(*error(401, "AuthenticationFailed", "Authentication failed."))
                    return
                if query.get("api-version") != [API_VERSION]:
                    self._reply(*error(400, "InvalidApiVersionParameter",
                                       f"The api-version '{query.get('api-version')}' is invalid."))
                    return
                answer = cloud.fault(self.command, url.path)
                if answer is None:
                    body = json.loads(raw) if raw.strip() else {}
                    with cloud.lock:
                        answer = cloud.answer(self.command, url.path, body)
                self._reply(*answer)

            do_GET = do_POST = do_PUT = _any

        return Handler
