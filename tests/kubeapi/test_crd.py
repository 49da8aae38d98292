"""Custom resources through the double: CRD install, schema validation with field paths,
pruning and fieldValidation, defaults, status and scale subresources, scope.

Real: the double over HTTP, the official client's CustomObjectsApi and the CRD
files the project ships or consumes (manifests/crd GpuPolicy, upstream
Karpenter NodePool/NodeClaim and KEDA ScaledObject vendored in vendor/crds).
Faked: nothing. Messages are checked against kube-apiserver's field-error
format (`<path>: Unsupported value: ...`, `Required value`, strict decoding).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from kubernetes import client

from tests.kubeapi.pytest_fixtures import kube_api  # noqa: F401 - the fixture behind `api`
from tests.kubeapi.server import ApiServer

ROOT = Path(__file__).resolve().parents[2]
GPU_CRD = ROOT / "manifests/crd/gpupolicies.gpu.kubeon.io.yaml"
SHARED = ROOT / "vendor" / "crds"  # vendored upstream CRDs (vendor/README.md)
NODEPOOL_CRD = SHARED / "karpenter.sh_nodepools.yaml"


@pytest.fixture
def api(kube_api: ApiServer) -> ApiServer:  # noqa: F811
    return kube_api


def nodepool(name: str, **spec_extra: object) -> dict:
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": {
        "template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                               "name": "default"},
                              "requirements": [{"key": "kubernetes.io/arch", "operator": "In",
                                                "values": ["amd64"]}]}}, **spec_extra}}


def test_installed_crd_is_discoverable_and_established(api: ApiServer) -> None:
    api.install_crd(NODEPOOL_CRD)
    crd = requests.get(api.url + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nodepools.karpenter.sh")
    conds = {c["type"]: c["status"] for c in crd.json()["status"]["conditions"]}
    assert conds == {"NamesAccepted": "True", "Established": "True"}
    resources = {r["name"]: r for r in requests.get(api.url + "/apis/karpenter.sh/v1").json()["resources"]}
    assert resources["nodepools"]["namespaced"] is False and "nodepools/status" in resources
    assert resources["nodepools/scale"]["kind"] == "Scale"


def test_schema_defaults_and_rejections_name_the_field(api: ApiServer) -> None:
    api.install_crd(NODEPOOL_CRD)
    custom = client.CustomObjectsApi(api.api_client())
    made = custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", nodepool("ok"))
    assert made["spec"]["disruption"]["consolidationPolicy"] == "WhenEmptyOrUnderutilized"  # schema default
    bad = nodepool("bad", weight=500)
    with pytest.raises(client.ApiException) as err:
        custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", bad)
    assert err.value.status == 422
    assert "spec.weight: Invalid value: 500: spec.weight in body should be less than or equal to 100" \
        in err.value.body
    bad = nodepool("bad")
    bad["spec"]["template"]["spec"]["requirements"][0]["operator"] = "Sometimes"
    with pytest.raises(client.ApiException) as err:
        custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", bad)
    assert 'spec.template.spec.requirements[0].operator: Unsupported value: \\"Sometimes\\"' in err.value.body
    bad = nodepool("bad")
    del bad["spec"]["template"]["spec"]["nodeClassRef"]
    with pytest.raises(client.ApiException) as err:
        custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", bad)
    assert "spec.template.spec.nodeClassRef: Required value" in err.value.body


def test_unknown_fields_are_pruned_warned_or_refused(api: ApiServer) -> None:
    api.install_crd(NODEPOOL_CRD)
    url = api.url + "/apis/karpenter.sh/v1/nodepools"
    body = nodepool("extra", surprise=True)
    warned = requests.post(url, json=body)
    assert warned.status_code == 201 and "surprise" not in warned.json()["spec"]
    assert warned.headers["Warning"] == '299 - "unknown field \\"spec.surprise\\""'
    strict = requests.post(url + "?fieldValidation=Strict", json={**body, "metadata": {"name": "extra2"}})
    assert strict.status_code == 400
    assert strict.json()["message"] == ('NodePool in version "v1" cannot be handled as a NodePool: strict decoding '
                                        'error: unknown field "spec.surprise"')


def test_status_subresource_and_unconditional_update_rules(api: ApiServer) -> None:
    api.install_crd(SHARED / "karpenter.sh_nodeclaims.yaml")
    custom = client.CustomObjectsApi(api.api_client())
    claim = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "c1"},
             "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                      "requirements": []},
             "status": {"nodeName": "ignored-on-create"}}
    made = custom.create_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", claim)
    assert "status" not in made
    patched = custom.patch_cluster_custom_object_status("karpenter.sh", "v1", "nodeclaims", "c1",
                                                        {"status": {"nodeName": "n1"}})
    assert patched["status"]["nodeName"] == "n1" and patched["metadata"]["generation"] == 1
    put = requests.put(api.url + "/apis/karpenter.sh/v1/nodeclaims/c1", json={**claim, "status": None})
    assert put.status_code == 422 and "must be specified for an update" in put.json()["message"]
    smp = requests.patch(api.url + "/apis/karpenter.sh/v1/nodeclaims/c1", data=b'{"metadata":{}}',
                         headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert smp.status_code == 415


def test_namespaced_custom_resource_and_crd_deletion_removes_objects(api: ApiServer) -> None:
    api.install_crd(SHARED / "keda.sh_scaledobjects.yaml")
    custom = client.CustomObjectsApi(api.api_client())
    so = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "so"},
          "spec": {"scaleTargetRef": {"name": "web"}, "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}}
    custom.create_namespaced_custom_object("keda.sh", "v1alpha1", "default", "scaledobjects", so)
    assert len(custom.list_namespaced_custom_object("keda.sh", "v1alpha1", "default", "scaledobjects")["items"]) == 1
    ext = client.ApiextensionsV1Api(api.api_client())
    ext.delete_custom_resource_definition("scaledobjects.keda.sh")
    assert requests.get(api.url + "/apis/keda.sh/v1alpha1/namespaces/default/scaledobjects").status_code == 404


def test_gpupolicy_crd(api: ApiServer) -> None:
    api.install_crd(GPU_CRD)
    custom = client.CustomObjectsApi(api.api_client())
    policy = {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "p"},
              "spec": {"mode": "Sometimes"}}
    with pytest.raises(client.ApiException) as err:
        custom.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", policy)
    assert err.value.status == 422 and "spec.mode: Unsupported value" in err.value.body
    policy["spec"]["mode"] = "Recommend"
    custom.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", policy)
    custom.patch_cluster_custom_object_status("gpu.kubeon.io", "v1alpha1", "gpupolicies", "p", {
        "status": {"effectiveMode": "Recommend", "requestedMode": "Automatic"}})
    table = requests.get(api.url + "/apis/gpu.kubeon.io/v1alpha1/gpupolicies",
                         headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}).json()
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[:4] == ["Name", "Kind", "Mode", "Requested"]
    assert table["rows"][0]["cells"][2:4] == ["Recommend", "Automatic"]
