"""`helm uninstall`'s pre-delete hook leaves nothing of the optimizer's behind (docs/install.md, "Uninstalling").

Real: the hook Job's command line and environment as `helm template` renders them (helm 4), run as a
subprocess authenticated as the Job's ServiceAccount (the controller's) against the real control plane
(tests/cluster) with the chart's CRDs and its RBAC as rendered with the test's values, the KEDA CRD and
Karpenter's own CRDs (v1.9.0); KWOK runs the nodes and kube-controller-manager's node lifecycle
controller keeps its own taints on them. The scene is written by an admin with the product's own record
shapes (ParkRecord, RestartRecord, the re-layout start patch, the time-slicing key names); the API
server's audit log says what the hook wrote. Faked: nothing; the "running controller" is the Lease it
holds.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import SETUP_KINDS, apply_objects, render_chart
from tests.controller.conftest import CONTROLLER_CLUSTER, KEDA_CRD, Scene, install_crds, make_deployment, make_node
from tests.install.chart import find, render

REPO = Path(__file__).resolve().parents[2]
CLUSTER = CONTROLLER_CLUSTER
GROUP, VERSION, PLURAL = "gpu.kubeon.io", "v1alpha1", "gpupolicies"
MANAGED = {"app.kubernetes.io/managed-by": "kubeon-gpu-optimizer"}
OPERATOR_NS, CONFIGMAP = "gpu-operator", "time-slicing-config"
# Taints kube-controller-manager's node lifecycle controller keeps on nodes itself (a cordon's
# node.kubernetes.io/unschedulable, not-ready while KWOK starts a node): Kubernetes', never ours or theirs.
KUBERNETES_TAINTS = "node.kubernetes.io/"


@pytest.fixture(scope="module", autouse=True)
def crds(kube_cluster: Cluster) -> None:
    """KEDA's ScaledObject CRD and Karpenter's own NodePool and NodeClaim CRDs (no Karpenter runs: nothing
    here launches a node)."""
    karpenter = kube_cluster.plane.upstream / "share" / "karpenter-crds"
    install_crds(kube_cluster, KEDA_CRD, karpenter / "karpenter.sh_nodepools.yaml",
                 karpenter / "karpenter.sh_nodeclaims.yaml")


@pytest.fixture
def cluster(scene: Scene) -> Iterator[Scene]:
    """The scene; the NodePools and the time-slicing ConfigMap it leaves (cluster-wide, or in the GPU
    Operator's namespace) go after the test."""
    yield scene
    custom = client.CustomObjectsApi(scene.admin)
    for name in ("kubeon-gpu", "their-pool"):
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", name)
    with contextlib.suppress(client.ApiException):
        client.CoreV1Api(scene.admin).delete_namespaced_config_map(CONFIGMAP, OPERATOR_NS)


def install_rbac(scene: Scene, values: dict[str, str]) -> None:
    """The chart's RBAC as `helm upgrade --install` with `values` leaves it (server-side apply: a rule the
    new render lacks goes), so the hook has exactly the grants of that install."""
    sets = ("certificates.mode=external", *(f"{k}={v}" for k, v in values.items()))
    apply_objects(scene.admin, [d for d in render_chart(*sets) if d["kind"] in SETUP_KINDS])


def hook_command(values: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The pre-delete Job's args and env, as the chart renders them."""
    jobs = [d for d in find(render(values), "Job") if d["metadata"]["name"] == "kubeon-gpu-optimizer-uninstall"]
    assert len(jobs) == 1
    assert jobs[0]["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    container = jobs[0]["spec"]["template"]["spec"]["containers"][0]
    return list(container["args"]), {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def run_hook(scene: Scene, values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Install the chart's RBAC for `values`, then run its hook as the Job's ServiceAccount."""
    install_rbac(scene, values)
    kubeconfig = scene.kubeconfig
    args, env = hook_command(values)
    return subprocess.run([sys.executable, "-m", "cli.main", *args, "--kubeconfig", kubeconfig],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def _deploy(scene: Scene, name: str, replicas: int, annotations: dict[str, str] | None = None) -> str:
    obj: dict[str, Any] = make_deployment(name, scene.namespace, replicas=replicas)
    if annotations:
        obj["metadata"]["annotations"] = annotations
    return str(scene.create(obj)["metadata"]["uid"])


def _policy(scene: Scene, name: str, status: dict[str, Any]) -> None:
    custom = client.CustomObjectsApi(scene.admin)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy", "metadata": {"name": name},
        "spec": {"mode": "Automatic", "scaleToZero": {"namespaces": [scene.namespace], "idleFor": "10m"}}})
    custom.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, name, {"status": status},
                                              _content_type="application/merge-patch+json")


@dataclass(frozen=True)
class Nodes:
    ts: str
    theirs: str
    mig: str


def _scene(scene: Scene) -> Nodes:
    """A cluster after the optimizer worked in it: parked workloads, relabelled nodes, its ConfigMap keys,
    ScaledObjects, NodeClaims and NodePools, scaler RoleBindings."""
    api, ns = scene.admin, scene.namespace
    names = Nodes(*(f"{ns}-{n}" for n in ("gpu-ts", "gpu-theirs", "gpu-mig")))
    parked_uid = _deploy(scene, "parked", 0, {"team": "ml"})
    _deploy(scene, "untouched", 1, {"team": "ml"})
    record = ParkRecord(replicas=3, scaled_at="2026-12-01T00:00:00Z", uid=parked_uid, undo={"restoreReplicas": 3})
    restart = RestartRecord(proposal="p1", started_at="2026-12-01T00:00:00Z", pods=["u1"])
    _policy(scene, "idle", {
        "parked": {f"Deployment/{ns}/parked": record.model_dump(by_alias=True, mode="json"),
                   f"Deployment/{ns}/gone": record.model_dump(by_alias=True, mode="json")},
        "restarts": {f"Deployment/{ns}/untouched": restart.model_dump(by_alias=True, mode="json")}})
    core = client.CoreV1Api(api)
    # time-sliced node: our key in the device plugin label; theirs elsewhere
    ts = make_node(names.ts)
    ts["metadata"]["labels"].update({PLUGIN_CONFIG_LABEL: config_key(4), "gpu.kubeon.io/pool": "shared",
                                     "team": "ml"})
    scene.create_node(ts)
    theirs = make_node(names.theirs)
    theirs["metadata"]["labels"][PLUGIN_CONFIG_LABEL] = "their-config"
    theirs["metadata"]["annotations"] = {"gpu.kubeon.io/do-not-disrupt": "true"}
    theirs["spec"] = {"unschedulable": True, "taints": [{"key": "team", "value": "x", "effect": "NoSchedule"}]}
    scene.create_node(theirs)
    # a node mid re-layout: cordoned by us, our start patch (record + mig-config-from), a taint of ours
    mig = make_node(names.mig)
    mig["metadata"]["labels"][MIG_CONFIG_LABEL] = "all-1g.10gb"
    mig["spec"] = {"taints": [{"key": "gpu.kubeon.io/draining", "effect": "NoSchedule"},
                              {"key": "team", "value": "x", "effect": "NoSchedule"}]}
    scene.create_node(mig)
    start = relayout.start(names.mig, "all-1g.10gb", "all-disabled", False, time.time(), "layout", "p2")
    start.patch["metadata"]["annotations"][MIG_CONFIG_FROM_ANNOTATION] = "all-disabled"
    core.patch_node(names.mig, start.patch, _content_type="application/merge-patch+json")
    core.create_namespaced_config_map(OPERATOR_NS, {
        "metadata": {"name": CONFIGMAP},
        "data": {"default": "version: v1\n", config_key(4): config_text(4)}})
    ours = keda_core.scaled_object(policy_name="idle", kind="Deployment", namespace=ns, name="parked",
                                   spec=AutoscaleSpec(target_utilization_percent=50, min=1, max=3),
                                   server_address="http://prom:9090")
    kscale.create_scaled_object(api, ours)
    kscale.create_scaled_object(api, {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "theirs", "namespace": ns},
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
    kscale.ensure_scaler_binding(api, ns, kscale.ServiceAccountRef("kubeon-gpu-optimizer", "kubeon-gpu"))
    create_lease(api, "kubeon-gpu", "kubeon-gpu-optimizer", "running-controller", 1, time.time())
    return names


def _ours(obj: dict[str, Any]) -> list[str]:
    meta = obj["metadata"]
    found = [f"label {k}" for k in meta.get("labels") or {} if k.startswith("gpu.kubeon.io/")]
    found += [f"annotation {k}" for k in meta.get("annotations") or {} if k.startswith("gpu.kubeon.io/")]
    found += [f"taint {t['key']}" for t in (obj.get("spec") or {}).get("taints") or []
              if t["key"].startswith("gpu.kubeon.io/")]
    if str((meta.get("labels") or {}).get(PLUGIN_CONFIG_LABEL, "")).startswith("kubeon-ts-"):
        found.append("our device-plugin config")
    return found


def test_uninstall_hook_leaves_nothing_of_ours(cluster: Scene) -> None:
    api, ns = cluster.admin, cluster.namespace
    names = _scene(cluster)
    done = run_hook(cluster, {"keda.enabled": "true"})
    assert done.returncode == 0, done.stdout + done.stderr
    scale = f"/apis/apps/v1/namespaces/{ns}/deployments/parked/scale"
    on_workloads = cluster.cluster.wait_for(lambda: [w for w in cluster.writes() if w[1].startswith("/apis/apps/")],
                                            timeout=10, message="the hook's workload writes in the audit log")
    assert on_workloads == [("PATCH", scale)], on_workloads

    apps, core, custom = client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
    parked = apps.read_namespaced_deployment("parked", ns)
    assert parked.spec.replicas == 3
    assert {k: v for k, v in parked.metadata.annotations.items()
            if not k.startswith("deployment.kubernetes.io/")} == {"team": "ml"}, "kube's revision and the user's only"
    assert apps.read_namespaced_deployment("untouched", ns).spec.replicas == 1
    status = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "idle").get("status") or {}
    assert not status.get("parked") and not status.get("restarts")

    nodes = {n["metadata"]["name"]: n for n in (api.sanitize_for_serialization(x) for x in core.list_node().items)}
    for name, node in nodes.items():
        assert [k for k in _ours(node) if k != "annotation gpu.kubeon.io/do-not-disrupt"] == [], name
    theirs, ts, mig = nodes[names.theirs], nodes[names.ts], nodes[names.mig]
    assert {k: v for k, v in theirs["metadata"]["annotations"].items() if k.startswith("gpu.kubeon.io/")} == {
        "gpu.kubeon.io/do-not-disrupt": "true"}, "an annotation users set for the optimizer to read is theirs: it stays"
    assert ts["metadata"]["labels"]["team"] == "ml"
    assert PLUGIN_CONFIG_LABEL not in ts["metadata"]["labels"]
    assert theirs["metadata"]["labels"][PLUGIN_CONFIG_LABEL] == "their-config"
    assert theirs["spec"]["unschedulable"] is True, "a cordon we did not set stays"
    assert mig["metadata"]["labels"][MIG_CONFIG_LABEL] == "all-disabled", "the layout label back"
    assert not mig["spec"].get("unschedulable"), "our cordon lifted"
    assert [t for t in mig["spec"]["taints"] if not t["key"].startswith(KUBERNETES_TAINTS)] == [
        {"key": "team", "value": "x", "effect": "NoSchedule"}]

    data = core.read_namespaced_config_map(CONFIGMAP, OPERATOR_NS).data
    assert data == {"default": "version: v1\n"}, "only our kubeon-ts-* keys go"
    assert [o["metadata"]["name"] for o in kscale.list_scaled_objects(api, ns)] == ["theirs"]
    pools = custom.list_cluster_custom_object("karpenter.sh", "v1", "nodepools")["items"]
    assert [p["metadata"]["name"] for p in pools] == ["their-pool"]
    assert kscale.list_scaler_bindings(api) == {}
    lease = get_lease(api, "kubeon-gpu", "kubeon-gpu-optimizer")
    assert lease is not None and lease.holder == "kubeon-gpu-uninstall", "the running controller stood down"
    assert f"woke=Deployment/{ns}/parked" in done.stderr


def test_uninstall_without_keda_touches_no_scaled_object_and_keeps_capacity_when_asked(cluster: Scene) -> None:
    """keda.enabled=false: the controller made none and has no KEDA RBAC; uninstall.keepCapacity keeps pools."""
    api, ns = cluster.admin, cluster.namespace
    _scene(cluster)
    args, _ = hook_command({"uninstall.keepCapacity": "true"})
    assert "--keep-capacity" in args and "--keda" not in args
    done = run_hook(cluster, {"uninstall.keepCapacity": "true"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(kscale.list_scaled_objects(api, ns)) == 2, "ours stays too: without KEDA RBAC it cannot go"
    pools = client.CustomObjectsApi(api).list_cluster_custom_object("karpenter.sh", "v1", "nodepools")["items"]
    assert sorted(p["metadata"]["name"] for p in pools) == ["kubeon-gpu", "their-pool"]
    assert client.AppsV1Api(api).read_namespaced_deployment("parked", ns).spec.replicas == 3


def test_cleanup_false_renders_no_hook() -> None:
    assert [d for d in find(render({"uninstall.cleanup": "false"}), "Job")] == []


def test_configmap_names_follow_values() -> None:
    _, env = hook_command({"gpuOperator.namespace": "nvidia", "gpuOperator.timeSlicingConfigMap": "ts"})
    assert env["KUBEON_GPU_OPERATOR_NAMESPACE"] == "nvidia" and env["KUBEON_GPU_TIME_SLICING_CONFIGMAP"] == "ts"
