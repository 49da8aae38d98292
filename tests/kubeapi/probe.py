"""The probe of the Kubernetes API semantics the optimizer's tools rely on.

    python -m tests.kubeapi probe --kubeconfig PATH

Runs against any API server the kubeconfig names: the test server (test_probe.py runs it
there in full) or a real cluster (kind, minikube), so the double can be checked against the
real thing with the same code. Each check prints PASS/FAIL with what differed; exit code 1 on
any failure. Everything is made in a namespace `kubeapi-probe-<random>` (deleted at the end)
plus one Node `kubeapi-probe-<random>` (deleted too).

Checks: create twice (409 AlreadyExists), stale update (409 Conflict), missing get (404 with
details), patch kinds (merge, JSON, strategic with merge keys, apply with managedFields and a
409 conflict, strategic on a custom resource 415), Go zero values (`spec: {}` on a Node and a
JSON patch below it), eviction with PDBs (429 with a DisruptionBudget cause, 201 when allowed,
500 with two budgets), watch from a resourceVersion (the later events, in order), watch-list's
initial-events bookmark, discovery (groups, subresources, verbs), kubectl round trips
(protobuf creates, client-side and server-side apply, get -o json, delete).
"""

from __future__ import annotations

import json
import random
import string
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests
import yaml
from kubernetes import client, config

JSON = "application/json"
MERGE = "application/merge-patch+json"
JSONPATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


class ProbeFailure(AssertionError):
    pass


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise ProbeFailure(what)


@dataclass
class Probe:
    api: client.ApiClient
    kubeconfig: str
    kubectl: str
    suffix: str = field(default_factory=lambda: "".join(random.choices(string.ascii_lowercase, k=6)))
    _session: requests.Session | None = None

    @property
    def ns(self) -> str:
        return f"kubeapi-probe-{self.suffix}"

    @property
    def session(self) -> requests.Session:
        """A requests session with the kubeconfig's server, credentials and CA."""
        if self._session is None:
            cfg = self.api.configuration
            session = requests.Session()
            token = cfg.get_api_key_with_prefix("authorization")
            if token:
                session.headers["Authorization"] = token
            session.verify = (cfg.ssl_ca_cert or True) if cfg.verify_ssl else False
            if cfg.cert_file:
                session.cert = (cfg.cert_file, cfg.key_file)
            self._session = session
        return self._session

    def call(self, method: str, path: str, body: Any = None, ctype: str = JSON,
             query: dict[str, str] | None = None) -> tuple[int, Any]:
        """One request; (status, decoded JSON body) whatever the status."""
        data = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
        resp = self.session.request(method, self.api.configuration.host + path, params=query or {}, data=data,
                                    headers={"Content-Type": ctype, "Accept": JSON}, timeout=30)
        try:
            return resp.status_code, resp.json() if resp.content else None
        except ValueError:
            return resp.status_code, resp.text

    def run_kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.kubectl, "--kubeconfig", self.kubeconfig, *args], input=stdin,
                              capture_output=True, text=True, timeout=60)

    # checks -------------------------------------------------------------------------------------
    def cm_path(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.ns}/configmaps" + (f"/{name}" if name else "")

    def create_twice(self) -> None:
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "twice"}, "data": {"a": "1"}}
        code, _ = self.call("POST", self.cm_path(), cm)
        expect(code == 201, f"first create: {code}")
        code, body = self.call("POST", self.cm_path(), cm)
        expect(code == 409 and body["reason"] == "AlreadyExists", f"second create: {code} {body}")
        expect(body["details"] == {"name": "twice", "kind": "configmaps"}, f"details {body.get('details')}")

    def stale_update(self) -> None:
        _, cm = self.call("GET", self.cm_path("twice"))
        stale = json.loads(json.dumps(cm))
        cm["data"]["a"] = "2"
        code, _ = self.call("PUT", self.cm_path("twice"), cm)
        expect(code == 200, f"fresh update: {code}")
        stale["data"]["a"] = "3"
        code, body = self.call("PUT", self.cm_path("twice"), stale)
        expect(code == 409 and body["reason"] == "Conflict", f"stale update: {code} {body}")
        expect("the object has been modified" in body["message"], body["message"])

    def missing_get(self) -> None:
        code, body = self.call("GET", self.cm_path("absent"))
        expect(code == 404 and body["reason"] == "NotFound", f"{code} {body}")
        expect(body["message"] == 'configmaps "absent" not found', body["message"])

    def patch_kinds(self) -> None:
        path = self.cm_path("twice")
        code, body = self.call("PATCH", path, {"data": {"b": "x", "a": None}}, MERGE)
        expect(code == 200 and body["data"] == {"b": "x"}, f"merge patch: {code} {body.get('data')}")
        code, body = self.call("PATCH", path, [{"op": "add", "path": "/data/c", "value": "y"}], JSONPATCH)
        expect(code == 200 and body["data"] == {"b": "x", "c": "y"}, f"json patch: {code}")
        code, body = self.call("PATCH", path, [{"op": "test", "path": "/data/c", "value": "nope"}], JSONPATCH)
        expect(code == 422, f"failed json patch test op: {code}")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "patched"},
               "spec": {"containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}]}}
        pods = f"/api/v1/namespaces/{self.ns}/pods"
        expect(self.call("POST", pods, pod)[0] == 201, "pod create")
        code, body = self.call("PATCH", f"{pods}/patched",
                               {"spec": {"containers": [{"name": "b", "image": "busybox:1.36"}]}}, STRATEGIC)
        images = [c["image"] for c in body["spec"]["containers"]] if code == 200 else code
        expect(images == ["busybox", "busybox:1.36"], f"strategic merge by name: {images}")
        applied = yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"},
                                  "data": {"k": "v"}})
        code, body = self.call("PATCH", self.cm_path("applied"), applied, APPLY, {"fieldManager": "probe-a"})
        expect(code == 201, f"apply create: {code} {body}")
        managers = {e["manager"]: e for e in body["metadata"].get("managedFields") or []}
        expect(managers.get("probe-a", {}).get("fieldsV1") == {"f:data": {"f:k": {}}},
               f"managedFields {body['metadata'].get('managedFields')}")
        code, body = self.call("PATCH", self.cm_path("applied"), applied.replace("k: v", "k: w"), APPLY,
                               {"fieldManager": "probe-b"})
        expect(code == 409 and body["details"]["causes"][0]["field"] == ".data.k", f"apply conflict: {code} {body}")
        code, body = self.call("PATCH", self.cm_path("applied"), applied.replace("k: v", "k: w"), APPLY,
                               {"fieldManager": "probe-b", "force": "true"})
        expect(code == 200 and body["data"] == {"k": "w"}, f"forced apply: {code}")
        code, body = self.call("PATCH", self.cm_path("applied"), applied, APPLY)
        expect(code in (400, 422), f"apply without fieldManager: {code}")

    def strategic_on_custom_resource(self) -> None:
        code, _ = self.call("PATCH", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/none", {}, STRATEGIC)
        expect(code in (404, 200), f"strategic on a built-in: {code}")
        crds = self.call("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")[1]["items"]
        cluster_crds = [c for c in crds if c["spec"]["scope"] == "Cluster"]
        if not cluster_crds:
            return
        crd = cluster_crds[0]
        version = next(v["name"] for v in crd["spec"]["versions"] if v.get("served"))
        path = f"/apis/{crd['spec']['group']}/{version}/{crd['spec']['names']['plural']}/absent"
        code, body = self.call("PATCH", path, {"metadata": {"labels": {"a": "b"}}}, STRATEGIC)
        expect(code == 415 and body["reason"] == "UnsupportedMediaType", f"strategic on a CR: {code} {body}")

    def zero_values(self) -> None:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.ns}}
        code, body = self.call("POST", "/api/v1/nodes", node)
        expect(code == 201 and body.get("spec") == {}, f"node without spec: {code} {body.get('spec')}")
        code, body = self.call("PATCH", f"/api/v1/nodes/{self.ns}",
                               [{"op": "add", "path": "/spec/unschedulable", "value": True}], JSONPATCH)
        expect(code == 200 and body["spec"].get("unschedulable") is True, f"json patch below spec: {code}")

    def eviction_with_pdbs(self) -> None:
        pods = f"/api/v1/namespaces/{self.ns}/pods"
        pdbs = f"/apis/policy/v1/namespaces/{self.ns}/poddisruptionbudgets"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "guarded", "labels": {"probe": "pdb"}},
               "spec": {"nodeName": self.ns, "containers": [{"name": "c", "image": "busybox"}]}}
        expect(self.call("POST", pods, pod)[0] == 201, "pod create")
        _, current = self.call("GET", f"{pods}/guarded")
        current["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        code, _ = self.call("PUT", f"{pods}/guarded/status", current)
        expect(code == 200, f"status update: {code}")
        pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep-one"},
               "spec": {"minAvailable": 1, "selector": {"matchLabels": {"probe": "pdb"}}}}
        expect(self.call("POST", pdbs, pdb)[0] == 201, "pdb create")
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "guarded"}}
        code, body = self._evict(eviction)
        expect(code == 429 and body["reason"] == "TooManyRequests", f"eviction against the budget: {code} {body}")
        expect(any(c.get("reason") == "DisruptionBudget" for c in body["details"]["causes"]), str(body))
        second = {**pdb, "metadata": {"name": "second"}, "spec": {**pdb["spec"], "minAvailable": 0}}
        expect(self.call("POST", pdbs, second)[0] == 201, "second pdb")
        code, body = self._evict(eviction)
        expect(code == 500 and "more than one PodDisruptionBudget" in body["message"], f"two budgets: {code}")
        for name in ("keep-one", "second"):
            self.call("DELETE", f"{pdbs}/{name}")
        code, _ = self._evict(eviction)
        expect(code == 201, f"allowed eviction: {code}")
        code, body = self._evict(eviction)
        expect(code == 404, f"evicting a missing pod: {code}")

    def _evict(self, eviction: dict[str, Any]) -> tuple[int, Any]:
        return self.call("POST", f"/api/v1/namespaces/{self.ns}/pods/guarded/eviction", eviction)

    def watch_from_resource_version(self) -> None:
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "watched"}, "data": {"n": "0"}}
        _, made = self.call("POST", self.cm_path(), cm)
        start = made["metadata"]["resourceVersion"]
        versions = []
        for n in (1, 2):
            _, body = self.call("PATCH", self.cm_path("watched"), {"data": {"n": str(n)}}, MERGE)
            versions.append(body["metadata"]["resourceVersion"])
        self.call("DELETE", self.cm_path("watched"))
        query = {"watch": "true", "resourceVersion": start, "fieldSelector": "metadata.name=watched",
                 "timeoutSeconds": "2"}
        events = self._watch(self.cm_path(), query, stop_after=3)
        got = [(e["type"], e["object"]["metadata"]["resourceVersion"], (e["object"].get("data") or {}).get("n"))
               for e in events]
        expect([g[0] for g in got] == ["MODIFIED", "MODIFIED", "DELETED"], f"events {got}")
        expect([g[1] for g in got[:2]] == versions and [g[2] for g in got[:2]] == ["1", "2"], f"events {got}")
        initial = self._watch(self.cm_path(), {"watch": "true", "sendInitialEvents": "true",
                                               "allowWatchBookmarks": "true", "resourceVersionMatch": "NotOlderThan",
                                               "timeoutSeconds": "2"}, stop_after=None, until_bookmark=True)
        expect(initial and initial[-1]["type"] == "BOOKMARK" and initial[-1]["object"]["metadata"].get(
            "annotations", {}).get("k8s.io/initial-events-end") == "true", f"watch-list ends with a bookmark: "
               f"{[e['type'] for e in initial]}")
        expect({e["object"]["metadata"]["name"] for e in initial if e["type"] == "ADDED"} >= {"twice", "applied"},
               "watch-list sends the current objects")

    def _watch(self, path: str, query: dict[str, str], stop_after: int | None,
               until_bookmark: bool = False) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        with self.session.get(self.api.configuration.host + path, params=query, headers={"Accept": JSON},
                              stream=True, timeout=30) as resp:
            for line in resp.iter_lines():
                if line.strip():
                    events.append(json.loads(line))
                if (stop_after and len(events) >= stop_after) or (until_bookmark and events and
                                                                  events[-1]["type"] == "BOOKMARK"):
                    break
        return events

    def discovery(self) -> None:
        _, core = self.call("GET", "/api/v1")
        names = {r["name"]: r for r in core["resources"]}
        for sub in ("pods/status", "pods/binding", "pods/eviction", "pods/log", "nodes/status"):
            expect(sub in names, f"/api/v1 lacks {sub}")
        expect(names["pods/eviction"].get("kind") == "Eviction" and names["pods/eviction"].get("group") == "policy",
               f"pods/eviction {names['pods/eviction']}")
        expect({"create", "delete", "get", "list", "patch", "update", "watch"} <= set(names["pods"]["verbs"]),
               "pod verbs")
        _, apps = self.call("GET", "/apis/apps/v1")
        scale = {r["name"]: r for r in apps["resources"]}.get("deployments/scale") or {}
        expect(scale.get("kind") == "Scale" and scale.get("group") == "autoscaling", f"deployments/scale {scale}")
        _, groups = self.call("GET", "/apis")
        served = {g["name"] for g in groups["groups"]}
        for group in ("apps", "policy", "coordination.k8s.io", "apiextensions.k8s.io",
                      "admissionregistration.k8s.io", "rbac.authorization.k8s.io"):
            expect(group in served, f"/apis lacks {group}")
        code, version = self.call("GET", "/version")
        expect(code == 200 and "gitVersion" in version, f"/version {code}")

    def kubectl_round_trips(self) -> None:
        def ok(*args: str, stdin: str | None = None) -> str:
            proc = self.run_kubectl(*args, stdin=stdin)
            expect(proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
            return proc.stdout.strip()

        ns = ["-n", self.ns]
        expect(ok("create", "configmap", "kc", *ns, "--from-literal=a=1") == "configmap/kc created", "create cm")
        expect(ok("create", "secret", "generic", "ks", *ns, "--from-literal=t=x") == "secret/ks created",
               "create secret")
        got = json.loads(ok("get", "configmap", "kc", *ns, "-o", "json"))
        expect(got["data"] == {"a": "1"}, f"get -o json {got.get('data')}")
        doc = yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ka"},
                              "data": {"x": "1"}})
        expect(ok("apply", *ns, "-f", "-", stdin=doc) == "configmap/ka created", "client-side apply")
        expect(ok("apply", *ns, "-f", "-", stdin=doc) == "configmap/ka unchanged", "client-side apply again")
        expect(ok("apply", "--server-side", *ns, "-f", "-", stdin=doc.replace("'1'", "'2'")) ==
               "configmap/ka serverside-applied", "server-side apply")
        expect(ok("get", "configmap", "ka", *ns, "-o", "jsonpath={.data.x}") == "2", "server-side applied value")
        deleted = ok("delete", "configmap", "ka", *ns)
        expect(deleted.startswith('configmap "ka" deleted'), f"delete: {deleted}")
        missing = self.run_kubectl("get", "configmap", "ka", *ns)
        expect(missing.returncode != 0 and 'configmaps "ka" not found' in missing.stderr, missing.stderr)

    # running ------------------------------------------------------------------------------------
    def checks(self) -> list[tuple[str, Callable[[], None]]]:
        return [("create twice", self.create_twice), ("stale update", self.stale_update),
                ("missing get", self.missing_get), ("patch kinds", self.patch_kinds),
                ("strategic merge on a custom resource", self.strategic_on_custom_resource),
                ("Go zero values", self.zero_values), ("eviction with PDBs", self.eviction_with_pdbs),
                ("watch from a resourceVersion", self.watch_from_resource_version), ("discovery", self.discovery),
                ("kubectl round trips", self.kubectl_round_trips)]

    def run(self) -> list[tuple[str, str]]:
        """(check, "" when it passed else what differed), in order."""
        results = []
        code, body = self.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                              "metadata": {"name": self.ns}})
        if code != 201:
            return [("namespace", f"cannot create {self.ns}: {code} {body}")]
        try:
            for name, check in self.checks():
                try:
                    check()
                    results.append((name, ""))
                except ProbeFailure as exc:
                    results.append((name, str(exc) or "failed"))
                except (KeyError, TypeError, ValueError) as exc:
                    results.append((name, f"unexpected answer: {type(exc).__name__}: {exc}"))
        finally:
            self.call("DELETE", f"/api/v1/namespaces/{self.ns}")
            self.call("DELETE", f"/api/v1/nodes/{self.ns}")
        return results


def probe(kubeconfig: str, kubectl: str) -> list[tuple[str, str]]:
    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        return Probe(api, kubeconfig, kubectl).run()
    finally:
        api.close()


def report(results: list[tuple[str, str]]) -> int:
    for name, failure in results:
        print(f"FAIL {name}: {failure}" if failure else f"PASS {name}")
    return 1 if any(failure for _, failure in results) else 0
