"""Fidelity of the test API server's REST semantics against documented kube-apiserver behaviour.

Real: the double over HTTP on loopback, the official `kubernetes` Python client
and `requests` for raw status codes and bodies. Faked: nothing; there is no
real kube-apiserver to compare with, so each assertion cites the behaviour of
one (status codes, Status bodies, resourceVersion and generation rules).
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


def pod(name: str, labels: dict[str, str] | None = None, **spec: object) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


@pytest.fixture
def core(api: ApiServer) -> client.CoreV1Api:
    return client.CoreV1Api(api.api_client())


def test_discovery_lists_core_groups_and_subresources(api: ApiServer) -> None:
    core_list = requests.get(api.url + "/api/v1").json()
    names = {r["name"]: r for r in core_list["resources"]}
    assert names["pods"]["namespaced"] and "watch" in names["pods"]["verbs"]
    assert names["pods"]["shortNames"] == ["po"]
    assert names["pods/eviction"]["kind"] == "Eviction" and names["pods/eviction"]["group"] == "policy"
    assert names["nodes"]["namespaced"] is False
    apps = {r["name"]: r for r in requests.get(api.url + "/apis/apps/v1").json()["resources"]}
    assert apps["deployments/scale"]["kind"] == "Scale" and apps["deployments/scale"]["group"] == "autoscaling"
    groups = {g["name"] for g in requests.get(api.url + "/apis").json()["groups"]}
    assert {"apps", "policy", "coordination.k8s.io", "events.k8s.io", "apiextensions.k8s.io",
            "admissionregistration.k8s.io"} <= groups
    assert requests.get(api.url + "/version").json()["major"] == "1"
    assert requests.get(api.url + "/apis/nope.example.com/v1").status_code == 404


def test_create_get_conflicts_and_not_found_are_status_objects(api: ApiServer) -> None:
    url = api.url + "/api/v1/namespaces/default/pods"
    created = requests.post(url, json=pod("a"))
    assert created.status_code == 201
    meta = created.json()["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
    again = requests.post(url, json=pod("a"))
    assert again.status_code == 409
    assert again.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": 'pods "a" already exists', "reason": "AlreadyExists", "code": 409,
                            "details": {"name": "a", "kind": "pods"}}
    missing = requests.get(url + "/nope")
    assert (missing.status_code, missing.json()["reason"]) == (404, "NotFound")
    assert missing.json()["message"] == 'pods "nope" not found'
    no_ns = requests.post(api.url + "/api/v1/namespaces/ghost/pods", json=pod("b"))
    assert (no_ns.status_code, no_ns.json()["message"]) == (404, 'namespaces "ghost" not found')
    wrong_kind = requests.post(url, json={**pod("c"), "kind": "Node"})
    assert wrong_kind.status_code == 400
    bad_json = requests.post(url, data=b"{nope", headers={"Content-Type": "application/json"})
    assert (bad_json.status_code, bad_json.json()["kind"]) == (400, "Status")
    for number in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):  # not JSON, or beyond a float64: refused
        body = b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"n","annotations":{}},"spec":{"x":%s}}' % number
        refused = requests.post(url, data=body, headers={"Content-Type": "application/json"})
        assert (refused.status_code, refused.json()["kind"]) == (400, "Status"), number
    assert requests.get(url + "/n").status_code == 404


def test_update_with_stale_resource_version_is_409_conflict(core: client.CoreV1Api) -> None:
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    stale = cm.metadata.resource_version
    cm.data = {"a": "2"}
    fresh = core.replace_namespaced_config_map("cfg", "default", cm)
    assert int(fresh.metadata.resource_version) > int(stale)
    cm.data = {"a": "3"}
    cm.metadata.resource_version = stale
    with pytest.raises(client.ApiException) as err:
        core.replace_namespaced_config_map("cfg", "default", cm)
    assert err.value.status == 409 and '"reason": "Conflict"' in err.value.body
    assert "the object has been modified" in err.value.body


def test_generation_bumps_on_spec_change_only_and_noop_keeps_resource_version(api: ApiServer) -> None:
    apps = client.AppsV1Api(api.api_client())
    dep = {"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"app": "d"}},
           "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    created = apps.create_namespaced_deployment("default", dep)
    assert created.metadata.generation == 1 and created.spec.replicas == 1
    labelled = apps.patch_namespaced_deployment("d", "default", {"metadata": {"labels": {"x": "y"}}})
    assert labelled.metadata.generation == 1
    scaled = apps.patch_namespaced_deployment("d", "default", {"spec": {"replicas": 3}})
    assert scaled.metadata.generation == 2
    same = apps.patch_namespaced_deployment("d", "default", {"spec": {"replicas": 3}})
    assert same.metadata.resource_version == scaled.metadata.resource_version
    status_only = apps.patch_namespaced_deployment("d", "default", {"status": {"replicas": 7}})
    assert status_only.status.replicas is None  # status is ignored on the main resource
    via_status = apps.patch_namespaced_deployment_status("d", "default", {"status": {"replicas": 7}})
    assert via_status.status.replicas == 7 and via_status.metadata.generation == 2


def test_label_and_field_selectors(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("a", {"app": "web", "tier": "front"}))
    core.create_namespaced_pod("default", pod("b", {"app": "web"}))
    core.create_namespaced_pod("default", pod("c", {"app": "db"}))

    def names(**kw: str) -> list[str]:
        return sorted(p.metadata.name for p in core.list_namespaced_pod("default", **kw).items)

    assert names(label_selector="app=web") == ["a", "b"]
    assert names(label_selector="app==web,tier") == ["a"]
    assert names(label_selector="app!=web") == ["c"]
    assert names(label_selector="app in (db, web),!tier") == ["b", "c"]
    assert names(label_selector="app notin (web)") == ["c"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="status.phase=Pending,metadata.name!=a") == ["b", "c"]
    assert names(field_selector="spec.nodeName=") == ["a", "b", "c"]
    with pytest.raises(client.ApiException) as err:
        core.list_namespaced_pod("default", field_selector="spec.bogus=1")
    assert err.value.status == 400 and "field label not supported: spec.bogus" in err.value.body
    listed = core.list_namespaced_pod("default")
    assert int(listed.metadata.resource_version) >= max(int(p.metadata.resource_version) for p in listed.items)


def test_dry_run_validates_but_does_not_store(api: ApiServer, core: client.CoreV1Api) -> None:
    out = core.create_namespaced_pod("default", pod("dry"), dry_run="All")
    assert out.metadata.name == "dry"
    with pytest.raises(client.ApiException) as err:
        core.read_namespaced_pod("dry", "default")
    assert err.value.status == 404
    invalid = requests.post(api.url + "/api/v1/namespaces/default/pods?dryRun=All",
                            json={"metadata": {"name": "nocontainers"}, "spec": {}})
    assert invalid.status_code == 422 and "spec.containers: Required value" in invalid.json()["message"]


def test_finalizers_hold_deletion_until_removed(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": "held", "finalizers": ["example.com/x"]}})
    core.delete_namespaced_config_map("held", "default")
    marked = core.read_namespaced_config_map("held", "default")
    assert marked.metadata.deletion_timestamp is not None
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_config_map("held", "default", {"metadata": {"finalizers": ["example.com/x", "b"]}})
    assert err.value.status == 422 and "no new finalizers" in err.value.body
    core.patch_namespaced_config_map("held", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(client.ApiException) as err:
        core.read_namespaced_config_map("held", "default")
    assert err.value.status == 404


def test_namespace_delete_removes_contents_and_owner_gc(api: ApiServer, core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "team"}})
    assert core.read_namespace("team").metadata.labels == {"kubernetes.io/metadata.name": "team"}
    owner = core.create_namespaced_config_map("team", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map("team", {"metadata": {"name": "child", "ownerReferences": [ref]}})
    core.delete_namespaced_config_map("owner", "team")
    assert [c.metadata.name for c in core.list_namespaced_config_map("team").items] == []
    core.create_namespaced_pod("team", pod("p"))
    core.delete_namespace("team")
    assert core.list_namespaced_pod("team").items == []
    with pytest.raises(client.ApiException) as err:
        core.read_namespace("team")
    assert err.value.status == 404


def test_generate_name_and_invalid_names(core: client.CoreV1Api) -> None:
    made = core.create_namespaced_pod("default", {"metadata": {"generateName": "web-"},
                                                  "spec": {"containers": [{"name": "c", "image": "x"}]}})
    assert made.metadata.name.startswith("web-") and len(made.metadata.name) == 9
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_pod("default", pod("Bad_Name"))
    assert err.value.status == 422 and "metadata.name" in err.value.body


def test_pod_spec_is_immutable_except_allowed_fields(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("imm"))
    core.patch_namespaced_pod("imm", "default", {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}})
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_pod("imm", "default", {"spec": {"nodeName": "n1"}})
    assert err.value.status == 422 and "pod updates may not change fields" in err.value.body


def test_binding_sets_node_once(api: ApiServer, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("b"))
    url = api.url + "/api/v1/namespaces/default/pods/b/binding"
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "b"}, "target": {"kind": "Node", "name": "n1"}}
    assert requests.post(url, json=body).status_code == 201
    bound = core.read_namespaced_pod("b", "default")
    assert bound.spec.node_name == "n1"
    assert any(c.type == "PodScheduled" and c.status == "True" for c in bound.status.conditions)
    again = requests.post(url, json=body)
    assert again.status_code == 409 and 'already assigned to node "n1"' in again.json()["message"]


def test_scale_subresource(api: ApiServer) -> None:
    apps = client.AppsV1Api(api.api_client())
    apps.create_namespaced_stateful_set("default", {"metadata": {"name": "s"}, "spec": {
        "serviceName": "s", "replicas": 2, "selector": {"matchLabels": {"app": "s"}},
        "template": {"metadata": {"labels": {"app": "s"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}})
    scale = apps.read_namespaced_stateful_set_scale("s", "default")
    assert (scale.spec.replicas, scale.status.selector) == (2, "app=s")
    out = apps.patch_namespaced_stateful_set_scale("s", "default", {"spec": {"replicas": 0}})
    assert out.spec.replicas == 0
    assert apps.read_namespaced_stateful_set("s", "default").spec.replicas == 0
    scale = apps.read_namespaced_stateful_set_scale("s", "default")
    scale.spec.replicas = 4
    assert apps.replace_namespaced_stateful_set_scale("s", "default", scale).spec.replicas == 4
    with pytest.raises(client.ApiException) as err:
        apps.patch_namespaced_stateful_set_scale("s", "default", {"spec": {"replicas": -1}})
    assert err.value.status == 422


def test_leases_and_events_in_both_groups(api: ApiServer) -> None:
    api = api.api_client()
    coord = client.CoordinationV1Api(api)
    coord.create_namespaced_lease("default", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}})
    assert coord.read_namespaced_lease("l", "default").spec.holder_identity == "me"
    client.CoreV1Api(api).create_namespaced_event("default", {
        "metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "Test", "message": "m"})
    client.EventsV1Api(api).create_namespaced_event("default", {
        "metadata": {"name": "e2"}, "eventTime": "2025-01-01T00:00:00.000000Z", "reportingController": "x",
        "reportingInstance": "x", "action": "A", "reason": "Test", "type": "Normal"})
    events = client.CoreV1Api(api).list_namespaced_event("default", field_selector="involvedObject.name=p")
    assert [e.metadata.name for e in events.items] == ["e1"]
