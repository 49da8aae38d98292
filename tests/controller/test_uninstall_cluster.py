"""`helm uninstall`'s pre-delete hook leaves nothing of the optimizer's behind (docs/install.md, "Uninstalling").

Real: the hook Job's command line and environment as `helm template` renders them (helm 4), run as a
subprocess against the test API server (tests/kubeapi) with the GpuPolicy, KEDA and Karpenter CRDs; the
scene is written with the product's own record shapes (ParkRecord, RestartRecord, the re-layout start
patch, the time-slicing key names). Faked: nothing; the "running controller" is the Lease it holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupolicy.capacity import relayout
from gpupolicy.capacity.layout import MIG_CONFIG_FROM_ANNOTATION
from gpupolicy.capacity.timeslicing import config_key, config_text
from gpupolicy.catalog import MIG_CONFIG_LABEL, PLUGIN_CONFIG_LABEL
from gpupolicy.model import AutoscaleSpec, ParkRecord, RestartRecord
from gpupolicy.scaling import autoscale as keda_core
from kube import scale as kscale
from kube.leases import create_lease, get_lease
from tests.controller.conftest import make_deployment, make_node
from tests.install.chart import find, render

REPO = Path(__file__).resolve().parents[2]
VENDOR = REPO / "vendor" / "crds"
POLICY_CRD = REPO / "manifests" / "crd" / "gpupolicies.gpu.kubeon.io.yaml"
NS = "ml"
GROUP, VERSION, PLURAL = "gpu.kubeon.io", "v1alpha1", "gpupolicies"
MANAGED = {"app.kubernetes.io/managed-by": "kubeon-gpu-optimizer"}


@pytest.fixture
def cluster() -> Any:
    from tests import kubeapi

    server = kubeapi.ApiServer.start(crd_files=[str(POLICY_CRD), str(VENDOR / "keda.sh_scaledobjects.yaml"),
                                                str(VENDOR / "karpenter.sh_nodepools.yaml"),
                                                str(VENDOR / "karpenter.sh_nodeclaims.yaml")])
    try:
        api = server.api_client()
        for ns in ("kubeon-gpu", NS, "gpu-operator"):
            client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
        server.api = api
        yield server
    finally:
        server.stop()


def hook_command(values: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The pre-delete Job's args and env, as the chart renders them."""
    jobs = [d for d in find(render(values), "Job") if d["metadata"]["name"] == "kubeon-gpu-optimizer-uninstall"]
    assert len(jobs) == 1
    assert jobs[0]["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    container = jobs[0]["spec"]["template"]["spec"]["containers"][0]
    return list(container["args"]), {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def run_hook(kubeconfig: str, values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    args, env = hook_command(values)
    return subprocess.run([sys.executable, "-m", "cli.main", *args, "--kubeconfig", kubeconfig],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def _deploy(api: client.ApiClient, name: str, replicas: int, annotations: dict[str, str] | None = None) -> str:
    obj: dict[str, Any] = make_deployment(name, NS, replicas=replicas)
    if annotations:
        obj["metadata"]["annotations"] = annotations
    made = client.AppsV1Api(api).create_namespaced_deployment(NS, obj)
    return str(made.metadata.uid)


def _policy(api: client.ApiClient, name: str, status: dict[str, Any]) -> None:
    custom = client.CustomObjectsApi(api)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy", "metadata": {"name": name},
        "spec": {"mode": "Automatic", "scaleToZero": {"namespaces": [NS], "idleFor": "10m"}}})
    custom.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, name, {"status": status},
                                              _content_type="application/merge-patch+json")


def _scene(api: client.ApiClient) -> dict[str, Any]:
    """A cluster after the optimizer worked in it: parked workloads, relabelled nodes, its ConfigMap keys,
    ScaledObjects, NodeClaims and NodePools, scaler RoleBindings."""
    parked_uid = _deploy(api, "parked", 0, {"team": "ml"})
    _deploy(api, "untouched", 1, {"team": "ml"})
    record = ParkRecord(replicas=3, scaled_at="2026-12-01T00:00:00Z", uid=parked_uid, undo={"restoreReplicas": 3})
    restart = RestartRecord(proposal="p1", started_at="2026-12-01T00:00:00Z", pods=["u1"])
    _policy(api, "idle", {"parked": {f"Deployment/{NS}/parked": record.model_dump(by_alias=True, mode="json"),
                                     f"Deployment/{NS}/gone": record.model_dump(by_alias=True, mode="json")},
                          "restarts": {f"Deployment/{NS}/untouched": restart.model_dump(by_alias=True, mode="json")}})
    core = client.CoreV1Api(api)
    # time-sliced node: our key in the device plugin label; theirs elsewhere
    ts = make_node("gpu-ts")
    ts["metadata"]["labels"].update({PLUGIN_CONFIG_LABEL: config_key(4), "gpu.kubeon.io/pool": "shared",  # type: ignore[index]
                                     "team": "ml"})
    core.create_node(ts)
    theirs = make_node("gpu-theirs")
    theirs["metadata"]["labels"][PLUGIN_CONFIG_LABEL] = "their-config"  # type: ignore[index]
    theirs["metadata"]["annotations"] = {"gpu.kubeon.io/do-not-disrupt": "true"}  # type: ignore[index]
    theirs["spec"] = {"unschedulable": True, "taints": [{"key": "team", "value": "x", "effect": "NoSchedule"}]}
    core.create_node(theirs)
    # a node mid re-layout: cordoned by us, our start patch (record + mig-config-from), a taint of ours
    mig = make_node("gpu-mig")
    mig["metadata"]["labels"][MIG_CONFIG_LABEL] = "all-1g.10gb"  # type: ignore[index]
    mig["spec"] = {"taints": [{"key": "gpu.kubeon.io/draining", "effect": "NoSchedule"},
                              {"key": "team", "value": "x", "effect": "NoSchedule"}]}
    core.create_node(mig)
    start = relayout.start("gpu-mig", "all-1g.10gb", "all-disabled", False, time.time(), "layout", "p2")
    start.patch["metadata"]["annotations"][MIG_CONFIG_FROM_ANNOTATION] = "all-disabled"
    core.patch_node("gpu-mig", start.patch, _content_type="application/merge-patch+json")
    core.create_namespaced_config_map("gpu-operator", {
        "metadata": {"name": "time-slicing-config"},
        "data": {"default": "version: v1\n", config_key(4): config_text(4)}})
    ours = keda_core.scaled_object(policy_name="idle", kind="Deployment", namespace=NS, name="parked",
                                   spec=AutoscaleSpec(target_utilization_percent=50, min=1, max=3),
                                   server_address="http://prom:9090")
    kscale.create_scaled_object(api, ours)
    kscale.create_scaled_object(api, {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "theirs", "namespace": NS},
        "spec": {"scaleTargetRef": {"name": "untouched"}, "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}})
    custom = client.CustomObjectsApi(api)
    pool = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "kubeon-gpu", "labels": {**MANAGED, "gpu.kubeon.io/capacity-policy": "cap"}},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                                            "name": "default"},
                                           "requirements": []}}}}
    custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", pool)
    custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", {
        **pool, "metadata": {"name": "their-pool"}})
    kscale.ensure_scaler_binding(api, NS, kscale.ServiceAccountRef("kubeon-gpu-optimizer", "kubeon-gpu"))
    create_lease(api, "kubeon-gpu", "kubeon-gpu-optimizer", "running-controller", 1, time.time())
    return {"parked_uid": parked_uid}


def _ours(obj: dict[str, Any]) -> list[str]:
    meta = obj["metadata"]
    found = [f"label {k}" for k in meta.get("labels") or {} if k.startswith("gpu.kubeon.io/")]
    found += [f"annotation {k}" for k in meta.get("annotations") or {} if k.startswith("gpu.kubeon.io/")]
    found += [f"taint {t['key']}" for t in (obj.get("spec") or {}).get("taints") or []
              if t["key"].startswith("gpu.kubeon.io/")]
    if str((meta.get("labels") or {}).get(PLUGIN_CONFIG_LABEL, "")).startswith("kubeon-ts-"):
        found.append("our device-plugin config")
    return found


def test_uninstall_hook_leaves_nothing_of_ours(cluster: Any) -> None:
    api = cluster.api
    _scene(api)
    mark = len(cluster.writes)
    done = run_hook(cluster.kubeconfig, {"keda.enabled": "true"})
    assert done.returncode == 0, done.stdout + done.stderr
    on_workloads = [(m, p) for m, p in cluster.writes[mark:] if p.startswith("/apis/apps/")]
    assert on_workloads == [("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/parked/scale")], on_workloads

    apps, core, custom = client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
    parked = apps.read_namespaced_deployment("parked", NS)
    assert parked.spec.replicas == 3 and parked.metadata.annotations == {"team": "ml"}
    assert apps.read_namespaced_deployment("untouched", NS).spec.replicas == 1
    status = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "idle").get("status") or {}
    assert not status.get("parked") and not status.get("restarts")

    nodes = {n["metadata"]["name"]: n for n in (api.sanitize_for_serialization(x) for x in core.list_node().items)}
    for name, node in nodes.items():
        assert [k for k in _ours(node) if k != "annotation gpu.kubeon.io/do-not-disrupt"] == [], name
    assert nodes["gpu-theirs"]["metadata"]["annotations"] == {"gpu.kubeon.io/do-not-disrupt": "true"}, (
        "an annotation users set for the optimizer to read is theirs: it stays")
    assert nodes["gpu-ts"]["metadata"]["labels"]["team"] == "ml"
    assert PLUGIN_CONFIG_LABEL not in nodes["gpu-ts"]["metadata"]["labels"]
    assert nodes["gpu-theirs"]["metadata"]["labels"][PLUGIN_CONFIG_LABEL] == "their-config"
    assert nodes["gpu-theirs"]["spec"]["unschedulable"] is True, "a cordon we did not set stays"
    assert nodes["gpu-mig"]["metadata"]["labels"][MIG_CONFIG_LABEL] == "all-disabled", "the layout label back"
    assert not nodes["gpu-mig"]["spec"].get("unschedulable"), "our cordon lifted"
    assert nodes["gpu-mig"]["spec"]["taints"] == [{"key": "team", "value": "x", "effect": "NoSchedule"}]

    data = core.read_namespaced_config_map("time-slicing-config", "gpu-operator").data
    assert data == {"default": "version: v1\n"}, "only our kubeon-ts-* keys go"
    assert [o["metadata"]["name"] for o in kscale.list_scaled_objects(api, NS)] == ["theirs"]
    pools = custom.list_cluster_custom_object("karpenter.sh", "v1", "nodepools")["items"]
    assert [p["metadata"]["name"] for p in pools] == ["their-pool"]
    assert kscale.list_scaler_bindings(api) == {}
    lease = get_lease(api, "kubeon-gpu", "kubeon-gpu-optimizer")
    assert lease is not None and lease.holder == "kubeon-gpu-uninstall", "the running controller stood down"
    assert f"woke=Deployment/{NS}/parked" in done.stderr


def test_uninstall_without_keda_touches_no_scaled_object_and_keeps_capacity_when_asked(cluster: Any) -> None:
    """keda.enabled=false: the controller made none and has no KEDA RBAC; uninstall.keepCapacity keeps pools."""
    api = cluster.api
    _scene(api)
    args, _ = hook_command({"uninstall.keepCapacity": "true"})
    assert "--keep-capacity" in args and "--keda" not in args
    done = run_hook(cluster.kubeconfig, {"uninstall.keepCapacity": "true"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(kscale.list_scaled_objects(api, NS)) == 2, "ours stays too: without KEDA RBAC it cannot go"
    pools = client.CustomObjectsApi(api).list_cluster_custom_object("karpenter.sh", "v1", "nodepools")["items"]
    assert sorted(p["metadata"]["name"] for p in pools) == ["kubeon-gpu", "their-pool"]
    assert client.AppsV1Api(api).read_namespaced_deployment("parked", NS).spec.replicas == 3


def test_cleanup_false_renders_no_hook() -> None:
    assert [d for d in find(render({"uninstall.cleanup": "false"}), "Job")] == []


def test_configmap_names_follow_values() -> None:
    _, env = hook_command({"gpuOperator.namespace": "nvidia", "gpuOperator.timeSlicingConfigMap": "ts"})
    assert env["KUBEON_GPU_OPERATOR_NAMESPACE"] == "nvidia" and env["KUBEON_GPU_TIME_SLICING_CONFIGMAP"] == "ts"
