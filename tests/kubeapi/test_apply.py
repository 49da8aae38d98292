"""Server-side apply against the examples of the Kubernetes docs (reference/using-api/
server-side-apply): field management, conflicts, force, shared ownership, ownership transfer
(the HPA example), field removal, list-map merging; over HTTP with the upstream wire format."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
import yaml

from tests.kubeapi import apply as ssa
from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401 - the fixture behind `api`
from tests.kubeapi.server import ApiServer
from tests.kubeapi.test_crd import GPU_CRD

CM = "/api/v1/namespaces/default/configmaps/test-cm"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments/nginx-deployment"


@pytest.fixture
def api(kube_api: ApiServer) -> ApiServer:  # noqa: F811
    return kube_api


def apply(api: ApiServer, path: str, doc: dict[str, Any], manager: str | None, force: bool = False,
          expect: int | tuple[int, ...] = (200, 201)) -> dict[str, Any]:
    params = {"fieldManager": manager} if manager else {}
    if force:
        params["force"] = "true"
    resp = requests.patch(api.url + path, params=params, data=yaml.safe_dump(doc),
                          headers={"Content-Type": "application/apply-patch+yaml"}, timeout=5)
    assert resp.status_code in ((expect,) if isinstance(expect, int) else expect), resp.text
    body: dict[str, Any] = resp.json()
    return body


def managers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["manager"]: e for e in obj["metadata"].get("managedFields") or []}


def config_map(data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "test-cm", "labels": {"test-label": "test"}},
            "data": data}


def test_apply_creates_and_records_managed_fields(api: ApiServer) -> None:
    """The docs' first example: managedFields of manager "kubectl" (operation Apply, FieldsV1)."""
    made = requests.patch(api.url + CM, params={"fieldManager": "kubectl"},
                          data=yaml.safe_dump(config_map({"key": "some value"})),
                          headers={"Content-Type": "application/apply-patch+yaml"}, timeout=5)
    assert made.status_code == 201
    entry = managers(made.json())["kubectl"]
    assert entry["operation"] == "Apply" and entry["apiVersion"] == "v1" and entry["fieldsType"] == "FieldsV1"
    assert entry["fieldsV1"] == {"f:data": {"f:key": {}}, "f:metadata": {"f:labels": {"f:test-label": {}}}}
    again = apply(api, CM, config_map({"key": "some value"}), "kubectl", expect=200)
    assert again["metadata"]["resourceVersion"] == made.json()["metadata"]["resourceVersion"]  # no-op


def test_field_manager_required(api: ApiServer) -> None:
    body = apply(api, CM, config_map({"a": "b"}), None, expect=422)
    assert "fieldManager: Required value: is required for apply patch" in body["message"]


def test_conflict_then_force_transfers_ownership(api: ApiServer) -> None:
    apply(api, CM, config_map({"key": "some value"}), "test")
    conflict = apply(api, CM, config_map({"key": "other value"}), "other", expect=409)
    assert conflict["reason"] == "Conflict"
    assert conflict["message"] == 'Apply failed with 1 conflict: conflict with "test": .data.key'
    assert conflict["details"]["causes"] == [{"reason": "FieldManagerConflict", "message": 'conflict with "test"',
                                              "field": ".data.key"}]
    forced = apply(api, CM, config_map({"key": "other value"}), "other", force=True)
    assert forced["data"] == {"key": "other value"}
    owners = managers(forced)
    assert owners["other"]["fieldsV1"]["f:data"] == {"f:key": {}}
    assert "f:data" not in owners["test"]["fieldsV1"]  # the label stays shared, .data.key moved


def test_shared_ownership_and_giving_it_up(api: ApiServer) -> None:
    """Two appliers with the same value share the field; changing it then conflicts; an applier
    that stops applying it gives it up and the other keeps it (no removal)."""
    apply(api, CM, config_map({"key": "v"}), "a")
    apply(api, CM, config_map({"key": "v"}), "b")
    both = requests.get(api.url + CM, timeout=5).json()
    assert all("f:key" in managers(both)[m]["fieldsV1"]["f:data"] for m in ("a", "b"))
    assert apply(api, CM, config_map({"key": "w"}), "a", expect=409)["details"]["causes"][0]["field"] == ".data.key"
    left = apply(api, CM, config_map({}), "b")
    assert left["data"] == {"key": "v"} and set(managers(left)) == {"a", "b"}


def test_field_removal(api: ApiServer) -> None:
    """A field the manager applied before and no longer applies is removed unless another
    manager owns it."""
    apply(api, CM, config_map({"keep": "1", "drop": "2", "shared": "3"}), "mine")
    requests.patch(api.url + CM, params={"fieldManager": "editor"}, data=json.dumps({"data": {"shared": "4"}}),
                   headers={"Content-Type": "application/merge-patch+json"}, timeout=5).raise_for_status()
    result = apply(api, CM, config_map({"keep": "1"}), "mine")
    assert result["data"] == {"keep": "1", "shared": "4"}
    editor = managers(result)["editor"]
    assert editor["operation"] == "Update" and editor["fieldsV1"] == {"f:data": {"f:shared": {}}}


def deployment(replicas: int | None, image: str = "nginx:1.14.2", env: list[dict[str, str]] | None = None
               ) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "nginx", "image": image, "ports": [{"containerPort": 80}]}
    if env is not None:
        container["env"] = env
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "nginx"}},
                            "template": {"metadata": {"labels": {"app": "nginx"}}, "spec": {"containers": [container]}}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "nginx-deployment"}, "spec": spec}


def test_transferring_ownership_to_a_controller(api: ApiServer) -> None:
    """The docs' HPA example: the controller's Update takes .spec.replicas from the applier;
    re-applying with another value conflicts; the applier drops replicas from its config and
    the controller's value stays."""
    apply(api, DEPLOY, deployment(3), "kubectl")
    scaled = requests.patch(api.url + DEPLOY, params={"fieldManager": "hpa-controller"},
                            data=json.dumps({"spec": {"replicas": 5}}),
                            headers={"Content-Type": "application/merge-patch+json"}, timeout=5).json()
    owners = managers(scaled)
    assert owners["hpa-controller"]["fieldsV1"] == {"f:spec": {"f:replicas": {}}}
    assert "f:replicas" not in owners["kubectl"]["fieldsV1"]["f:spec"]
    conflict = apply(api, DEPLOY, deployment(3), "kubectl", expect=409)
    assert conflict["message"].startswith('Apply failed with 1 conflict: conflict with "hpa-controller" using '
                                          'apps/v1 at ') and conflict["message"].endswith(": .spec.replicas")
    result = apply(api, DEPLOY, deployment(None), "kubectl")
    assert result["spec"]["replicas"] == 5


def test_list_maps_merge_by_key_and_atomic_lists_replace(api: ApiServer) -> None:
    """containers by name, env by name, ports by containerPort+protocol; a second manager's env
    entry survives the first manager's re-apply; tolerations are atomic."""
    apply(api, DEPLOY, deployment(1, env=[{"name": "A", "value": "1"}]), "helm")
    extra = deployment(None, env=[{"name": "B", "value": "2"}])
    extra["spec"]["template"]["spec"]["containers"][0].pop("image")
    extra["spec"]["template"]["spec"]["containers"][0].pop("ports")
    merged = apply(api, DEPLOY, extra, "sidecar-injector")
    container = merged["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    fields = managers(merged)["sidecar-injector"]["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert fields == {'k:{"name":"nginx"}': {".": {}, "f:env": {'k:{"name":"B"}': {".": {}, "f:name": {},
                                                                                 "f:value": {}}},
                                            "f:name": {}}}
    helm_fields = managers(merged)["helm"]["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert 'k:{"containerPort":80,"protocol":"TCP"}' in helm_fields['k:{"name":"nginx"}']["f:ports"]
    again = apply(api, DEPLOY, deployment(1, image="nginx:1.27", env=[]), "helm")
    container = again["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "nginx:1.27" and container["env"] == [{"name": "B", "value": "2"}]
    tol = deployment(1)
    tol["spec"]["template"]["spec"]["tolerations"] = [{"key": "a", "operator": "Exists"}]
    apply(api, DEPLOY, tol, "helm")
    tol["spec"]["template"]["spec"]["tolerations"] = [{"key": "b", "operator": "Exists"}]
    assert apply(api, DEPLOY, tol, "helm")["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "b", "operator": "Exists"}]


def test_custom_resource_list_types() -> None:
    """x-kubernetes-list-type map/set/atomic and map-keys drive the merge of custom resources."""
    schema = ssa.Schema({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "rules": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object"}},
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "order": {"type": "array", "items": {"type": "string"}}}}}})
    live = {"spec": {"rules": [{"name": "a", "x": 1}], "tags": ["t1"], "order": ["1", "2"]}}
    config = {"spec": {"rules": [{"name": "b", "x": 2}], "tags": ["t2"], "order": ["3"]}}
    assert ssa.merge(live, config, schema) == {"spec": {"rules": [{"name": "a", "x": 1}, {"name": "b", "x": 2}],
                                                        "tags": ["t1", "t2"], "order": ["3"]}}
    assert ssa.field_set(config, schema) == {("f:spec", "f:rules", 'k:{"name":"b"}'),
                                             ("f:spec", "f:rules", 'k:{"name":"b"}', "f:name"),
                                             ("f:spec", "f:rules", 'k:{"name":"b"}', "f:x"),
                                             ("f:spec", "f:tags", 'v:"t2"'), ("f:spec", "f:order")}


def test_apply_custom_resource_and_status_is_ignored(api: ApiServer) -> None:
    api.install_crd(GPU_CRD)
    path = "/apis/gpu.kubeon.io/v1alpha1/gpupolicies/share"
    doc = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "share"},
           "spec": {"mode": "Recommend"}, "status": {"effectiveMode": "Automatic"}}
    made = apply(api, path, doc, "helm", expect=201)
    assert made["spec"]["mode"] == "Recommend" and "effectiveMode" not in (made.get("status") or {})
    doc["spec"]["mode"] = "Sometimes"
    assert apply(api, path, doc, "helm", expect=422)["reason"] == "Invalid"
