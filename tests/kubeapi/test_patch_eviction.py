"""PATCH content types and the Eviction API's PodDisruptionBudget arithmetic.

Real: the double over HTTP, the official client (which picks
strategic-merge for dict bodies and JSON patch for lists) and `requests` for
explicit content types. Faked: pod readiness is written through pods/status
(no kubelet). Behaviour checked against upstream: strategic merge merges
containers by name but replaces taints/tolerations (no patchMergeKey);
merge patch replaces lists; eviction answers 429 with a DisruptionBudget
cause, 500 for a pod under two budgets, 201 otherwise.
"""

from __future__ import annotations

import pytest
import requests
from kubernetes import client

from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401 - the fixture behind `api`
from tests.kubeapi.server import ApiServer


@pytest.fixture
def api(kube_api: ApiServer) -> ApiServer:  # noqa: F811
    return kube_api


def patch(api: ApiServer, path: str, body: object, ctype: str) -> requests.Response:
    import json

    return requests.patch(api.url + path, data=json.dumps(body), headers={"Content-Type": ctype})


def test_patch_types_on_a_node(api: ApiServer) -> None:
    core = client.CoreV1Api(api.api_client())
    core.create_node({"metadata": {"name": "n1", "labels": {"a": "1"}},
                      "spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}})
    path = "/api/v1/nodes/n1"
    out = patch(api, path, {"spec": {"unschedulable": True, "taints": [{"key": "y", "effect": "NoExecute"}]}},
                "application/strategic-merge-patch+json").json()
    assert out["spec"]["unschedulable"] is True
    assert out["spec"]["taints"] == [{"key": "y", "effect": "NoExecute"}]  # taints have no merge key
    out = patch(api, path, {"metadata": {"labels": {"a": None, "b": "2"}}}, "application/merge-patch+json").json()
    assert out["metadata"]["labels"] == {"b": "2"}
    out = patch(api, path, [{"op": "add", "path": "/metadata/annotations", "value": {"k/v": "1"}},
                            {"op": "replace", "path": "/spec/unschedulable", "value": False}],
                "application/json-patch+json").json()
    assert out["metadata"]["annotations"] == {"k/v": "1"} and out["spec"]["unschedulable"] is False
    failed = patch(api, path, [{"op": "test", "path": "/spec/unschedulable", "value": True}],
                   "application/json-patch+json")
    assert failed.status_code == 422
    stale = patch(api, path, {"metadata": {"resourceVersion": "1", "labels": {"c": "3"}}},
                  "application/merge-patch+json")
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert patch(api, path, {}, "text/plain").status_code == 415
    assert patch(api, "/api/v1/nodes/ghost", {}, "application/merge-patch+json").status_code == 404


def test_strategic_merge_keys_for_containers_and_finalizers(api: ApiServer) -> None:
    apps = client.AppsV1Api(api.api_client())
    apps.create_namespaced_deployment("default", {"metadata": {"name": "d", "finalizers": ["a/x"]}, "spec": {
        "selector": {"matchLabels": {"app": "d"}}, "template": {"metadata": {"labels": {"app": "d"}}, "spec": {
            "containers": [{"name": "main", "image": "m:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                           {"name": "side", "image": "s:1"}],
            "tolerations": [{"key": "t1", "operator": "Exists"}]}}}})
    out = apps.patch_namespaced_deployment("d", "default", {
        "metadata": {"finalizers": ["b/y"]},
        "spec": {"replicas": 0, "template": {"spec": {
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": None,
                                                                      "nvidia.com/mig-1g.10gb": "1"}}}],
            "tolerations": [{"key": "t2", "operator": "Exists"}]}}}})
    containers = out.spec.template.spec.containers
    assert [c.name for c in containers] == ["main", "side"] and containers[0].image == "m:1"
    assert containers[0].resources.limits == {"nvidia.com/mig-1g.10gb": "1"}
    assert [t.key for t in out.spec.template.spec.tolerations] == ["t2"]
    assert out.metadata.finalizers == ["a/x", "b/y"] and out.spec.replicas == 0


def make_pods(api: ApiServer, n: int, ready: int, labels: dict[str, str], owned: bool = False) -> list[str]:
    """n pods (the first `ready` Ready), optionally controlled by a ReplicaSet of n replicas."""
    core = client.CoreV1Api(api.api_client())
    refs = []
    if owned:
        rs = client.AppsV1Api(api.api_client()).create_namespaced_replica_set("default", {
            "metadata": {"name": "rs"}, "spec": {"replicas": n, "selector": {"matchLabels": labels},
                                                 "template": {"metadata": {"labels": labels}, "spec": {
                                                     "containers": [{"name": "c", "image": "x"}]}}}})
        refs = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": rs.metadata.uid,
                 "controller": True}]
    names = []
    for i in range(n):
        name = f"p{i}"
        core.create_namespaced_pod("default", {"metadata": {"name": name, "labels": labels, "ownerReferences": refs},
                                               "spec": {"containers": [{"name": "c", "image": "x"}]}})
        status = "True" if i < ready else "False"
        core.patch_namespaced_pod_status(name, "default", {"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": status}]}})
        names.append(name)
    return names


def evict(api: ApiServer, name: str) -> requests.Response:
    return requests.post(api.url + f"/api/v1/namespaces/default/pods/{name}/eviction", json={
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}})


@pytest.mark.parametrize(("budget", "pods", "ready", "allowed"), [
    ({"minAvailable": 2}, 3, 3, 1),
    ({"minAvailable": 3}, 3, 3, 0),
    ({"minAvailable": "50%"}, 4, 4, 2),  # ceil(50% of 4) = 2 must stay
    ({"minAvailable": "60%"}, 4, 4, 1),  # ceil(2.4) = 3 must stay
    ({"maxUnavailable": 1}, 3, 3, 1),
    ({"maxUnavailable": "30%"}, 4, 4, 2),  # ceil(1.2) = 2 may go
    ({"maxUnavailable": 0}, 2, 2, 0),
    ({"minAvailable": 2}, 3, 2, 0),  # one pod not Ready: healthy 2, nothing to spare
], ids=["min-int", "min-int-tight", "min-50pct", "min-60pct-rounds-up", "max-int", "max-30pct-rounds-up",
        "max-zero", "min-int-unready"])
def test_pdb_arithmetic(api: ApiServer, budget: dict, pods: int, ready: int, allowed: int) -> None:
    client.PolicyV1Api(api.api_client()).create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "pdb"}, "spec": {"selector": {"matchLabels": {"app": "a"}}, **budget}})
    names = make_pods(api, pods, ready, {"app": "a"}, owned=True)
    codes = [evict(api, name).status_code for name in names[:ready]]
    assert codes == [201] * allowed + [429] * (ready - allowed)


def test_percent_budget_over_pods_without_controller_allows_nothing(api: ApiServer) -> None:
    client.PolicyV1Api(api.api_client()).create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "pdb"}, "spec": {"selector": {"matchLabels": {"app": "a"}}, "maxUnavailable": "50%"}})
    names = make_pods(api, 2, 2, {"app": "a"})
    assert evict(api, names[0]).status_code == 429


def test_eviction_status_bodies(api: ApiServer) -> None:
    policy = client.PolicyV1Api(api.api_client())
    policy.create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "one"}, "spec": {"selector": {"matchLabels": {"app": "a"}}, "minAvailable": 1}})
    names = make_pods(api, 1, 1, {"app": "a"})
    refused = evict(api, names[0])
    assert refused.status_code == 429 and refused.json()["reason"] == "TooManyRequests"
    assert refused.json()["details"]["causes"][0] == {
        "reason": "DisruptionBudget", "message": "The disruption budget one needs 1 healthy pods and has 1 currently"}
    policy.create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "two"}, "spec": {"selector": {}, "maxUnavailable": 5}})
    doubled = evict(api, names[0])
    assert doubled.status_code == 500 and "more than one PodDisruptionBudget" in doubled.json()["message"]
    assert evict(api, "ghost").status_code == 404


def test_pending_pod_is_evicted_regardless_and_client_eviction(api: ApiServer) -> None:
    core = client.CoreV1Api(api.api_client())
    client.PolicyV1Api(api.api_client()).create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "all"}, "spec": {"selector": {"matchLabels": {"app": "a"}}, "minAvailable": 5}})
    core.create_namespaced_pod("default", {"metadata": {"name": "pend", "labels": {"app": "a"}},
                                           "spec": {"containers": [{"name": "c", "image": "x"}]}})
    core.create_namespaced_pod_eviction("pend", "default", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "pend", "namespace": "default"}})
    assert core.list_namespaced_pod("default").items == []
