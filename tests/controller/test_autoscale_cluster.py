"""KEDA ScaledObjects for `scaleToZero.autoscale` policies, against the test API server.

Real: the test API server with the GpuPolicy CRD and KEDA's ScaledObject CRD
(it validates custom resources against the CRD's openAPIV3Schema, so a
created object is schema-valid), the frame's PolicySync/PolicyStore/runner,
the AutoscaleReconciler. Faked: leadership (always leader); no Prometheus is
queried (the ScaledObject only carries its URL).
"""

from __future__ import annotations

from typing import Any

import yaml
from kubernetes import client

from controller.autoscale import AutoscaleReconciler
from controller.loop import ReconcileRunner
from controller.policysync import PolicySync
from controller.scaletozero import ScaleToZeroReconciler
from gpupolicy.scaling import autoscale as core
from kube import scale as kscale
from tests.controller.conftest import make_deployment
from tests.controller.conftest_scale import scale_context

NS = "research"
PROM = "http://prometheus.monitoring:9090"


def policy(mode: str, maximum: int = 4) -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "gpu-autoscale"},
            "spec": {"mode": mode, "scaleToZero": {
                "namespaces": [NS], "workloadSelector": {"matchLabels": {"tier": "inference"}},
                "autoscale": {"targetUtilizationPercent": 60, "min": 1, "max": maximum}}}}


def setup(api: client.ApiClient, mode: str, keda: bool = True,
          controller_api: client.ApiClient | None = None) -> ReconcileRunner:
    """Workloads and the policy made by `api` (admin); the controller acts through `controller_api`."""
    apps = client.AppsV1Api(api)
    for name, tier in (("llm", "inference"), ("batch", "batch")):
        obj: dict[str, Any] = make_deployment(name, NS)
        obj["metadata"]["labels"] = {"tier": tier}  # workloadSelector matches the workload's own labels
        apps.create_namespaced_deployment(NS, obj)
    client.CustomObjectsApi(api).create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies",
                                                              policy(mode))
    # a configured source (never queried here): Automatic may act
    ctx = scale_context(controller_api or api, api, PROM, keda=keda)
    # in the registry's order: scale to zero binds the chart's scaler role in the policy's namespaces
    # (the ScaledObject rules are in it), then autoscale writes there
    return ReconcileRunner(ctx, [PolicySync(), ScaleToZeroReconciler(), AutoscaleReconciler()])


def status(api: client.ApiClient) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies",
                                                                 "gpu-autoscale")
    return dict(obj.get("status") or {})


def test_without_keda_writes_the_scaled_object_is_offered_as_yaml(scale_api: Any) -> None:
    """keda.enabled=false (the default; the guide's RBAC has no KEDA rule): even in Automatic nothing is
    read or written; the ScaledObject's YAML is a Proposed recommendation in the policy status."""
    api = scale_api.api
    runner = setup(api, "Automatic", keda=False)
    runner.run_all()
    assert kscale.list_scaled_objects(api, NS) == []
    [proposal] = status(api)["proposals"]
    assert (proposal["target"], proposal["state"]) == (f"Deployment/{NS}/llm", "Proposed")
    assert "keda.enabled=true" in proposal["action"]
    offered = yaml.safe_load(proposal["reason"])
    assert offered["kind"] == "ScaledObject" and offered["spec"]["scaleTargetRef"]["name"] == "llm"
    assert "&id" not in proposal["reason"] and "*id" not in proposal["reason"], "no YAML anchors"


def test_recommend_shows_the_scaled_object_and_writes_nothing(scale_api: Any) -> None:
    api = scale_api.api
    runner = setup(api, "Recommend")
    runner.run_all()
    assert kscale.list_scaled_objects(api, NS) == []
    proposals = status(api)["proposals"]
    assert [(p["target"], p["state"]) for p in proposals] == [(f"Deployment/{NS}/llm", "Proposed")]
    assert "DCGM_FI_DEV_GPU_UTIL" in proposals[0]["reason"] and PROM in proposals[0]["reason"]


def test_automatic_creates_updates_and_removes_its_scaled_object(keda_scale_api: Any) -> None:
    """As the chart's controller ServiceAccount with keda.enabled=true: every ScaledObject verb it uses
    (create, get, list, update, delete) is one the chart grants."""
    api = keda_scale_api.api
    runner = setup(api, "Automatic", controller_api=keda_scale_api.controller_api)
    runner.run_all()
    made = kscale.list_scaled_objects(api, NS)
    assert [o["metadata"]["name"] for o in made] == ["kubeon-gpu-llm"]  # batch is not selected
    so = made[0]
    assert so["spec"]["scaleTargetRef"]["name"] == "llm"
    assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == PROM
    assert so["metadata"]["labels"][core.POLICY_LABEL] == "gpu-autoscale"
    assert [p["state"] for p in status(api)["proposals"]] == ["Applied"]

    version = so["metadata"]["resourceVersion"]
    runner.run_all()  # up to date: not rewritten
    assert kscale.list_scaled_objects(api, NS)[0]["metadata"]["resourceVersion"] == version

    client.CustomObjectsApi(api).patch_cluster_custom_object(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", "gpu-autoscale",
        {"spec": {"scaleToZero": {"autoscale": {"max": 8}}}}, _content_type="application/merge-patch+json")
    runner.run_all()
    assert kscale.list_scaled_objects(api, NS)[0]["spec"]["maxReplicaCount"] == 8

    client.CustomObjectsApi(api).delete_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies",
                                                              "gpu-autoscale")
    runner.run_all()
    assert kscale.list_scaled_objects(api, NS) == []  # the scaler binding outlived the policy until then
    runner.run_all()
    assert NS not in kscale.list_scaler_bindings(api)  # and goes once nothing of ours is left there
