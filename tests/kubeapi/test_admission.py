"""Dynamic admission through a real TLS webhook, as kube-apiserver calls it.

Real: the double, a small HTTPS webhook server (stdlib http.server + ssl) on
loopback with a CA and serving cert from certs/material.py (cryptography),
caBundle verification, AdmissionReview v1 on the wire, the official client
and `requests`. Faked: the webhook's decisions are test functions, and a
Service reference is mapped to the local URL with ApiServer.map_service.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client

from certs.material import generate_ca, issue_serving_cert
from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401 - the fixture behind `api`
from tests.kubeapi.server import ApiServer

Decide = Callable[[dict[str, Any]], dict[str, Any]]


class Webhook:
    """An HTTPS AdmissionReview server; routes map a path to a decision function."""

    def __init__(self, routes: dict[str, Decide]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, Any]]] = []
        ca = generate_ca()
        serving = issue_serving_cert(ca, ["hook.kubeon-gpu.svc"], ["127.0.0.1"])
        self.ca_bundle = base64.b64encode(ca.cert_pem()).decode()
        self._dir = tempfile.TemporaryDirectory()
        cert, key = Path(self._dir.name, "tls.crt"), Path(self._dir.name, "tls.key")
        cert.write_bytes(serving.cert_pem())
        key.write_bytes(serving.key_pem())
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                path = self.path.split("?")[0]
                hook.requests.append((path, review["request"]))
                answer = {"uid": review["request"]["uid"], **hook.routes[path](review["request"])}
                data = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": answer}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._dir.cleanup()

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]


def allow(_: dict[str, Any]) -> dict[str, Any]:
    return {"allowed": True}


def add_label(key: str, value: str) -> Decide:
    def decide(req: dict[str, Any]) -> dict[str, Any]:
        ops = [{"op": "add", "path": f"/metadata/labels/{key}", "value": value}]
        if not req["object"]["metadata"].get("labels"):
            ops = [{"op": "add", "path": "/metadata/labels", "value": {key: value}}]
        if req["object"]["metadata"].get("labels", {}).get(key) == value:
            return {"allowed": True}
        return {"allowed": True, "patchType": "JSONPatch", "warnings": [f"labelled {key}"],
                "patch": base64.b64encode(json.dumps(ops).encode()).decode()}
    return decide


def deny_labelled(req: dict[str, Any]) -> dict[str, Any]:
    if req["object"]["metadata"].get("labels", {}).get("deny") == "true":
        return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": "pods labelled deny"}}
    return {"allowed": True}


SLOW_HELD = threading.Event()  # the slow hook answers when this is set (or after 30 s)
SLOW_ANSWERED: list[str] = []


def slow(_: dict[str, Any]) -> dict[str, Any]:
    SLOW_HELD.wait(30)
    SLOW_ANSWERED.append("answered")
    return {"allowed": True}


@pytest.fixture
def api(kube_api: ApiServer) -> ApiServer:  # noqa: F811
    return kube_api


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook({"/mutate": add_label("mutated", "yes"), "/validate": deny_labelled, "/allow": allow,
                    "/slow": slow, "/a": add_label("a", "1"), "/b": add_label("b", "1")})
    yield hook
    hook.close()


def hook_entry(name: str, client_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    entry = {"name": name, "clientConfig": client_config, "sideEffects": "None",
             "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
             "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                        "resources": ["pods"], "scope": "Namespaced"}]}
    entry.update(extra)
    return entry


def register(api: ApiServer, kind: str, name: str, *hooks: dict[str, Any]) -> None:
    plural = "mutatingwebhookconfigurations" if kind == "Mutating" else "validatingwebhookconfigurations"
    requests.post(f"{api.url}/apis/admissionregistration.k8s.io/v1/{plural}", json={
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": f"{kind}WebhookConfiguration",
        "metadata": {"name": name}, "webhooks": list(hooks)}).raise_for_status()


def make_pod(api: ApiServer, name: str, labels: dict[str, str] | None = None, query: str = "") -> requests.Response:
    return requests.post(f"{api.url}/api/v1/namespaces/default/pods{query}", json={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}})


def test_mutation_warning_denial_and_review_contents(api: ApiServer, webhook: Webhook) -> None:
    cfg = {"url": webhook.url + "/mutate", "caBundle": webhook.ca_bundle}
    register(api, "Mutating", "m", hook_entry("mutate.example.com", cfg))
    register(api, "Validating", "v", hook_entry("deny.example.com", {**cfg, "url": webhook.url + "/validate"}))
    created = make_pod(api, "ok")
    assert created.status_code == 201
    assert created.json()["metadata"]["labels"] == {"mutated": "yes"}
    assert created.headers["Warning"] == '299 - "labelled mutated"'
    path, req = webhook.requests[0]
    assert path == "/mutate" and req["operation"] == "CREATE" and req["name"] == "ok"
    assert req["namespace"] == "default" and req["dryRun"] is False
    assert req["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert req["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert req["userInfo"]["username"] and req["oldObject"] is None
    assert req["options"]["kind"] == "CreateOptions"
    assert webhook.requests[1][1]["object"]["metadata"]["labels"] == {"mutated": "yes"}  # validating sees mutation
    denied = make_pod(api, "bad", {"deny": "true"})
    assert denied.status_code == 403
    assert denied.json()["message"] == 'admission webhook "deny.example.com" denied the request: pods labelled deny'
    core = client.CoreV1Api(api.api_client())
    core.patch_namespaced_pod("ok", "default", {"metadata": {"annotations": {"x": "y"}}})
    update = webhook.requests[-1][1]
    assert update["operation"] == "UPDATE" and update["oldObject"]["metadata"]["name"] == "ok"


def test_ca_bundle_is_verified_and_failure_policy_decides(api: ApiServer, webhook: Webhook) -> None:
    wrong_ca = base64.b64encode(generate_ca("other").cert_pem()).decode()
    register(api, "Validating", "strict", hook_entry("strict.example.com",
                                                     {"url": webhook.url + "/allow", "caBundle": wrong_ca}))
    failed = make_pod(api, "a")
    assert failed.status_code == 500
    assert 'failed calling webhook "strict.example.com"' in failed.json()["message"]
    assert webhook.requests == []  # the TLS handshake failed before any request
    requests.delete(f"{api.url}/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/strict")
    register(api, "Validating", "lenient", hook_entry("lenient.example.com", {
        "url": webhook.url + "/allow", "caBundle": wrong_ca}, failurePolicy="Ignore"))
    assert make_pod(api, "b").status_code == 201


def test_timeout_with_ignore_does_not_block(api: ApiServer, webhook: Webhook) -> None:
    register(api, "Validating", "slow", hook_entry("slow.example.com", {
        "url": webhook.url + "/slow", "caBundle": webhook.ca_bundle}, timeoutSeconds=1, failurePolicy="Ignore"))
    SLOW_HELD.clear()
    SLOW_ANSWERED.clear()
    try:
        assert make_pod(api, "a").status_code == 201
        assert SLOW_ANSWERED == [], "the pod waited for the hook's answer, not its 1 s timeout"
    finally:
        SLOW_HELD.set()


def test_service_reference_uses_service_dns_name(api: ApiServer, webhook: Webhook) -> None:
    api.map_service("kubeon-gpu", "hook", webhook.url)
    register(api, "Mutating", "svc", hook_entry("svc.example.com", {
        "service": {"namespace": "kubeon-gpu", "name": "hook", "path": "/mutate"}, "caBundle": webhook.ca_bundle}))
    assert make_pod(api, "a").json()["metadata"]["labels"] == {"mutated": "yes"}
    assert webhook.paths() == ["/mutate"]


def test_selectors_skip_webhooks(api: ApiServer, webhook: Webhook) -> None:
    client.CoreV1Api(api.api_client()).create_namespace({"metadata": {"name": "opt-in", "labels": {"gpu": "on"}}})
    cfg = {"url": webhook.url + "/mutate", "caBundle": webhook.ca_bundle}
    register(api, "Mutating", "sel", hook_entry(
        "sel.example.com", cfg, namespaceSelector={"matchLabels": {"gpu": "on"}},
        objectSelector={"matchExpressions": [{"key": "gpu.kubeon.io/skip", "operator": "DoesNotExist"}]}))
    assert "mutated" not in make_pod(api, "default-ns").json()["metadata"]["labels"]
    in_ns = requests.post(f"{api.url}/api/v1/namespaces/opt-in/pods", json={
        "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert in_ns.json()["metadata"]["labels"] == {"mutated": "yes"}
    skipped = requests.post(f"{api.url}/api/v1/namespaces/opt-in/pods", json={
        "metadata": {"name": "q", "labels": {"gpu.kubeon.io/skip": "true"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert "mutated" not in skipped.json()["metadata"]["labels"]
    assert webhook.paths() == ["/mutate"]


def test_dry_run_and_side_effects(api: ApiServer, webhook: Webhook) -> None:
    cfg = {"url": webhook.url + "/mutate", "caBundle": webhook.ca_bundle}
    register(api, "Mutating", "m", hook_entry("m.example.com", cfg))
    dry = make_pod(api, "a", query="?dryRun=All")
    assert dry.status_code == 201 and dry.json()["metadata"]["labels"] == {"mutated": "yes"}
    assert webhook.requests[0][1]["dryRun"] is True
    assert requests.get(f"{api.url}/api/v1/namespaces/default/pods/a").status_code == 404
    register(api, "Validating", "unsafe", hook_entry("unsafe.example.com", {**cfg, "url": webhook.url + "/allow"},
                                                     sideEffects="Some"))
    refused = make_pod(api, "b", query="?dryRun=All")
    assert refused.status_code == 400 and "does not support dry run" in refused.json()["message"]


def test_reinvocation_if_needed(api: ApiServer, webhook: Webhook) -> None:
    cfg = {"caBundle": webhook.ca_bundle}
    register(api, "Mutating", "1-a", hook_entry("a.example.com", {**cfg, "url": webhook.url + "/a"},
                                                reinvocationPolicy="IfNeeded"))
    register(api, "Mutating", "2-b", hook_entry("b.example.com", {**cfg, "url": webhook.url + "/b"}))
    assert make_pod(api, "p").json()["metadata"]["labels"] == {"a": "1", "b": "1"}
    assert webhook.paths() == ["/a", "/b", "/a"]
