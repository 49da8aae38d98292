"""Protobuf bodies (the upstream generated messages in proto/) and Go zero values.

Real: the messages generated from upstream's generated.proto, requests over HTTP, kubectl 1.35's
typed clients (`kubectl create namespace|configmap|secret|deployment` send protobuf). The JSON a
real server would write for the same object is written out by hand from upstream's Go types."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import requests

from tests.kubeapi import protobuf
from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401 - the fixture behind `api`
from tests.kubeapi.server import ApiServer
from tests.missing import missing

KUBECTL = Path(__file__).resolve().parents[2] / ".tools/bin/kubectl"
PB = {"Content-Type": protobuf.MEDIA, "Accept": f"{protobuf.MEDIA},application/json"}

POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "default", "labels": {"app": "x"}, "uid": "u-1",
                 "creationTimestamp": "2026-01-02T03:04:05Z", "resourceVersion": "7",
                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u-0",
                                      "controller": True}],
                 "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                                    "time": "2026-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                                    "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}]},
    "spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                             "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "512Mi"}},
                             "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 5},
                             "securityContext": {"allowPrivilegeEscalation": False, "runAsUser": 0}}],
             "volumes": [{"name": "v", "emptyDir": {}}, {"name": "s", "secret": {"secretName": "tls"}}],
             "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
             "securityContext": {}, "automountServiceAccountToken": False},
    "status": {"phase": "Running", "startTime": "2026-01-02T03:04:06Z"},
}


def test_round_trip_keeps_kubernetes_json() -> None:
    """Quantities, int-or-string, times, FieldsV1, inlined volume sources, pointer zeros (false, 0)
    and empty structs come back exactly as the JSON a real server writes."""
    envelope = protobuf.encode(POD)
    assert envelope is not None and envelope.startswith(b"k8s\x00")
    assert protobuf.decode(envelope, "v1", "Pod") == protobuf.zero_values(json.loads(json.dumps(POD)))


def test_secret_bytes_and_go_durations() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"a": "Yg=="},
              "type": "Opaque"}
    assert protobuf.decode(protobuf.encode(secret) or b"", "v1", "Secret") == secret
    assert [protobuf.go_duration(n) for n in (0, 1_500_000_000, 3_600_000_000_000, 90_000_000_000)] == \
        ["0s", "1.5s", "1h0m0s", "1m30s"]
    assert protobuf.parse_go_duration("1h0m30s") == 3_630_000_000_000


def test_create_and_get_over_protobuf(kube_api: ApiServer) -> None:  # noqa: F811
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"k": "v"}}
    url = f"{kube_api.url}/api/v1/namespaces/default/configmaps"
    made = requests.post(url, data=protobuf.encode(cm), headers=PB, timeout=5)
    assert made.status_code == 201 and made.headers["Content-Type"] == protobuf.MEDIA
    assert protobuf.decode(made.content, "v1", "ConfigMap")["data"] == {"k": "v"}
    as_json = requests.get(f"{url}/cfg", timeout=5)
    assert as_json.headers["Content-Type"] == "application/json" and as_json.json()["data"] == {"k": "v"}
    again = requests.post(url, data=protobuf.encode(cm), headers=PB, timeout=5)
    assert again.status_code == 409
    assert protobuf.decode(again.content, "v1", "Status")["reason"] == "AlreadyExists"
    bad = requests.post(url, data=b"not protobuf", headers=PB, timeout=5)
    assert bad.status_code == 400


def test_watch_streams_length_prefixed_events(kube_api: ApiServer) -> None:  # noqa: F811
    url = f"{kube_api.url}/api/v1/namespaces?watch=true&timeoutSeconds=1"
    with requests.get(url, headers=PB, stream=True, timeout=5) as resp:
        assert resp.headers["Content-Type"] == protobuf.WATCH_MEDIA
        data = resp.raw.read()
    names = []
    while data:
        (size,) = struct.unpack(">I", data[:4])
        event = protobuf._new("k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent")
        event.ParseFromString(data[4:4 + size])
        data = data[4 + size:]
        assert event.type == "ADDED"  # type: ignore[attr-defined]
        names.append(protobuf.decode(event.object.raw, "v1", "Namespace")["metadata"]["name"])  # type: ignore
    assert {"default", "kube-system"} <= set(names)


def test_go_zero_values_on_read(kube_api: ApiServer) -> None:  # noqa: F811
    """A Node created without spec is served with `spec: {}`, so a JSON Patch adding
    /spec/unschedulable works as on a real server (kubectl cordon's patch)."""
    base = f"{kube_api.url}/api/v1/nodes"
    requests.post(base, json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}, timeout=5)
    node = requests.get(f"{base}/n1", timeout=5).json()
    assert node["spec"] == {} and node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 0}}
    patched = requests.patch(f"{base}/n1", data=json.dumps([{"op": "add", "path": "/spec/unschedulable",
                                                            "value": True}]),
                             headers={"Content-Type": "application/json-patch+json"}, timeout=5)
    assert patched.status_code == 200 and patched.json()["spec"] == {"unschedulable": True}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "x"}]}}
    made = requests.post(f"{kube_api.url}/api/v1/namespaces/default/pods", json=pod, timeout=5).json()
    assert made["spec"]["securityContext"] == {} and made["spec"]["containers"][0]["resources"] == {}


def test_kubectl_create_sends_protobuf(kube_api: ApiServer) -> None:  # noqa: F811
    if not shutil.which(str(KUBECTL)):
        missing("kubectl 1.35 not in .tools/bin (scripts/install-test-deps.sh)")
    def kubectl(*args: str) -> str:
        proc = subprocess.run([str(KUBECTL), "--kubeconfig", kube_api.kubeconfig, *args], capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert kubectl("create", "namespace", "kubeon-gpu") == "namespace/kubeon-gpu created"
    assert kubectl("create", "configmap", "c", "-n", "kubeon-gpu", "--from-literal=a=b") == "configmap/c created"
    assert kubectl("create", "secret", "generic", "s", "-n", "kubeon-gpu", "--from-literal=token=t0k") == \
        "secret/s created"
    assert kubectl("create", "deployment", "web", "-n", "kubeon-gpu", "--image=nginx", "--replicas=0") == \
        "deployment.apps/web created"
    secret = json.loads(kubectl("get", "secret", "s", "-n", "kubeon-gpu", "-o", "json"))
    assert secret["data"] == {"token": "dDBr"} and secret["type"] == "Opaque"
    deploy = json.loads(kubectl("get", "deploy", "web", "-n", "kubeon-gpu", "-o", "json"))
    assert deploy["spec"]["replicas"] == 0 and deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    assert kubectl("get", "cm", "c", "-n", "kubeon-gpu", "-o", "jsonpath={.data.a}") == "b"
    assert kubectl("delete", "namespace", "kubeon-gpu") == 'namespace "kubeon-gpu" deleted'
