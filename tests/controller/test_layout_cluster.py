"""Sharing layout end to end: the test API server, the scheduler stand-in and a GPU Operator stand-in.

Real: the test API server (tests/kubeapi) with the GpuPolicy CRD, its
scheduler, workload and kubelet stand-ins, the frame's PolicySync,
PolicyStore, Recorder and ReconcileRunner, the LayoutReconciler. The GPU
Operator is a stand-in (tests/kubeapi/gpu_operator.py) that reacts to the
labels as the device plugin and the MIG manager do, with the GPU Operator's
default MIG config. Faked: leadership (always leader), the clock (so the
re-layout time bound is reached without waiting) and the metrics source
(sharing needs one configured to leave Recommend; the layout reads none).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from controller.context import ControllerContext
from controller.layout import LayoutReconciler
from controller.loop import ReconcileRunner
from controller.policies import PolicyStore
from controller.policysync import PolicySync
from controller.recorder import ControllerMetrics, Recorder
from gpupolicy.capacity.layout import RELAYOUT_ANNOTATION
from gpupolicy.capacity.timeslicing import config_key
from gpupolicy.model import Mode
from tests.controller.conftest import FakeClock, ScriptedMetrics
from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_node, make_pod
from tests.cluster.gpu_operator import GpuOperator, parse_plugin_config, shared_replicas

CRD = "manifests/crd/gpupolicies.gpu.kubeon.io.yaml"
NS = "ml"
OPERATOR_NS = "gpu-operator"
CONFIGMAP = "time-slicing-config"


def sharing_policy(name: str, mode: str, **sharing: Any) -> dict[str, Any]:
    approvals = sharing.pop("approvals", None)
    spec: dict[str, Any] = {"mode": mode, "sharing": sharing}
    if approvals is not None:
        spec["approvals"] = approvals
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}


class World:
    """A cluster, the GPU Operator stand-in and one controller (runner + layout reconciler)."""

    def __init__(self, cluster: Cluster, prometheus: bool = True) -> None:
        self.cluster = cluster
        api = cluster.api_client
        assert api is not None
        self.api = api
        self.clock = FakeClock()
        self.operator = GpuOperator(api)
        self.layout = LayoutReconciler(timeout_seconds=300)
        self.ctx = ControllerContext(
            api=api, namespace="kubeon-gpu", default_mode=Mode.RECOMMEND,
            prometheus_url="http://prometheus.test:9090" if prometheus else None,
            metrics=ScriptedMetrics() if prometheus else None, clock=self.clock,
            recorder=Recorder(api, ControllerMetrics(), self.clock, "test"), policies=PolicyStore(),
            is_leader=lambda: True)
        self.runner = ReconcileRunner(self.ctx, [PolicySync(), self.layout])

    def rounds(self, n: int = 6) -> None:
        """Controller pass, operator pass, cluster passes; `n` times."""
        for _ in range(n):
            self.runner.run_all()
            self.operator.reconcile_once()
            self.cluster.settle()
            self.clock.advance(20)

    def node(self, name: str) -> dict[str, Any]:
        return self.api.sanitize_for_serialization(self.cluster.core.read_node(name))  # type: ignore[no-any-return]

    def configmap(self) -> dict[str, str]:
        obj = self.cluster.core.read_namespaced_config_map(CONFIGMAP, OPERATOR_NS)
        return dict(obj.data or {})

    def status(self, name: str) -> dict[str, Any]:
        obj = self.cluster.custom.get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
        return dict(obj.get("status") or {})

    def bound(self) -> dict[str, str]:
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.cluster.pods(NS)}

    def events(self, reason: str) -> list[dict[str, Any]]:
        return self.cluster.events(self.ctx.recorder.namespace, reason)  # the chart's only Events namespace


@pytest.fixture
def make_world() -> Iterator[Any]:
    """`make_world(nodes, configmap=True, prometheus=True)`: a World, closed after the test."""
    opened: list[Cluster] = []

    def make(nodes: list[dict[str, Any]], *, configmap: bool = True, prometheus: bool = True) -> World:
        cluster = Cluster(nodes=nodes, crd_files=[CRD], background=False, karpenter=False).__enter__()
        opened.append(cluster)
        cluster.ensure_namespace(NS)
        cluster.ensure_namespace(OPERATOR_NS)
        cluster.ensure_namespace("kubeon-gpu")
        if configmap:
            cluster.core.create_namespaced_config_map(OPERATOR_NS, {"metadata": {"name": CONFIGMAP}, "data": {}})
        return World(cluster, prometheus=prometheus)

    yield make
    for cluster in opened:
        cluster.close()


def create_policy(world: World, obj: dict[str, Any]) -> None:
    world.cluster.custom.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", obj)


def pending_pods(world: World, resource: str, count: int, prefix: str = "p") -> None:
    for i in range(count):
        world.cluster.create(make_pod(f"{prefix}{i}", NS, gpus=1, gpu_resource=resource))


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_time_sliced_pods_get_a_key_a_label_then_allocatable_then_a_node(make_world: Any) -> None:
    world = make_world([make_node("gpu-ts", "NVIDIA-L4", gpus=2)])
    create_policy(world, sharing_policy("share", "Automatic", strategy="TimeSlicing", replicas=4))
    pending_pods(world, "nvidia.com/gpu.shared", 6)
    world.cluster.settle()
    assert all(node is None for node in world.bound().values())
    world.rounds(3)
    key = config_key(4)
    data = world.configmap()
    assert list(data) == [key]
    config = parse_plugin_config(data[key])  # the device plugin's own fields, unknown ones refused
    assert shared_replicas(config) == (4, True)
    assert config["sharing"]["timeSlicing"]["failRequestsGreaterThanOne"] is True
    node = world.node("gpu-ts")
    assert node["metadata"]["labels"]["nvidia.com/device-plugin.config"] == key
    assert node["status"]["allocatable"]["nvidia.com/gpu.shared"] == "8"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert set(world.bound().values()) == {"gpu-ts"}
    proposals = world.status("share")["proposals"]
    assert [(p["target"], p["state"]) for p in proposals] == [("Node/gpu-ts", "Applied")]
    assert "serves 6 pending time-sliced pods; node is empty" in proposals[0]["reason"]
    assert world.operator.errors == []


def test_an_edited_config_is_a_new_key_and_the_old_one_goes(make_world: Any) -> None:
    world = make_world([make_node("gpu-ts", "NVIDIA-L4", gpus=1)])
    create_policy(world, sharing_policy("share", "Automatic", strategy="TimeSlicing", replicas=4))
    pending_pods(world, "nvidia.com/gpu.shared", 1)
    world.rounds(3)
    assert list(world.configmap()) == [config_key(4)]
    for pod in world.cluster.pods(NS):
        world.cluster.core.delete_namespaced_pod(pod["metadata"]["name"], NS, grace_period_seconds=0)
    world.cluster.custom.patch_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", "share",
                                                     {"spec": {"sharing": {"replicas": 2}}})
    world.cluster.core.patch_namespaced_config_map(CONFIGMAP, OPERATOR_NS, {"data": {"user-key": "version: v1\n"}})
    # the share pods now come from the edited policy: 2 replicas, a node with 4 holds none of them
    for i in range(2):
        world.cluster.create(make_pod(f"q{i}", NS, gpus=1, gpu_resource="nvidia.com/gpu.shared",
                                      annotations={"gpu.kubeon.io/policy": "share"}))
    world.rounds(4)
    assert world.node("gpu-ts")["metadata"]["labels"]["nvidia.com/device-plugin.config"] == config_key(2)
    assert sorted(world.configmap()) == sorted([config_key(2), "user-key"])  # someone else's key is kept


def test_pending_mig_pods_on_an_empty_a100_get_its_layout(make_world: Any) -> None:
    world = make_world([make_node("gpu-a100", "NVIDIA-A100-SXM4-80GB", gpus=1)])
    create_policy(world, sharing_policy("mig", "Automatic", strategy="MIG", migProfile="1g.10gb"))
    pending_pods(world, "nvidia.com/mig-1g.10gb", 7)
    world.rounds(6)
    node = world.node("gpu-a100")
    assert node["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"
    assert node["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success"
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    assert not node["spec"].get("unschedulable")
    assert RELAYOUT_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert set(world.bound().values()) == {"gpu-a100"}
    assert world.operator.applied == [("gpu-a100", "all-1g.10gb")]
    assert world.configmap() == {}
    assert world.events("MigRelayout")


def test_a_node_holding_a_gpu_pod_is_never_re_laid_out(make_world: Any) -> None:
    world = make_world([make_node("gpu-busy", "NVIDIA-A100-SXM4-80GB", gpus=2)])
    world.cluster.create(make_pod("whole", NS, gpus=1))
    world.cluster.settle()
    create_policy(world, sharing_policy("mig", "Automatic", strategy="MIG", migProfile="1g.10gb"))
    pending_pods(world, "nvidia.com/mig-1g.10gb", 3)
    world.rounds(4)
    node = world.node("gpu-busy")
    assert "nvidia.com/mig.config" not in node["metadata"]["labels"]
    assert not node["spec"].get("unschedulable")
    assert world.operator.applied == []
    planned = {c["type"]: c for c in world.status("mig")["conditions"]}["LayoutPlanned"]
    assert planned["status"] == "False" and "3 pod(s) no node can serve" in planned["message"]


def test_a_failed_layout_is_rolled_back_uncordoned_and_reported(make_world: Any) -> None:
    world = make_world([make_node("gpu-a100", "NVIDIA-A100-SXM4-80GB", gpus=1)])
    create_policy(world, sharing_policy("mig", "Automatic", strategy="MIG", migProfile="1g.10gb"))
    world.operator.fail("gpu-a100", "all-1g.10gb")
    pending_pods(world, "nvidia.com/mig-1g.10gb", 2)
    world.rounds(1)
    assert world.node("gpu-a100")["spec"].get("unschedulable") is True  # cordoned first
    for _ in range(6):
        world.rounds(1)
        if not world.node("gpu-a100")["spec"].get("unschedulable"):
            break
    node = world.node("gpu-a100")
    assert node["metadata"]["labels"]["nvidia.com/mig.config"] == "all-disabled"
    assert node["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success"
    assert not node["spec"].get("unschedulable")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    failures = world.events("MigRelayoutFailed")
    assert any("the MIG manager reported failed" in e["message"] for e in failures)
    assert any(e["involvedObject"]["kind"] == "GpuPolicy" for e in failures)


def test_restart_mid_relayout_carries_on_from_the_annotation(make_world: Any) -> None:
    world = make_world([make_node("gpu-a100", "NVIDIA-A100-SXM4-80GB", gpus=1)])
    create_policy(world, sharing_policy("mig", "Automatic", strategy="MIG", migProfile="1g.10gb"))
    pending_pods(world, "nvidia.com/mig-1g.10gb", 7)
    world.runner.run_all()  # cordon + record
    record = json.loads(world.node("gpu-a100")["metadata"]["annotations"][RELAYOUT_ANNOTATION])
    assert record["step"] == "cordoned" and record["target"] == "all-1g.10gb"
    world.layout = LayoutReconciler(timeout_seconds=300)  # a new process: nothing in memory
    world.ctx.policies = PolicyStore()
    world.runner = ReconcileRunner(world.ctx, [PolicySync(), world.layout])
    world.rounds(5)
    node = world.node("gpu-a100")
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    assert not node["spec"].get("unschedulable")
    assert set(world.bound().values()) == {"gpu-a100"}


def test_recommend_shows_the_plan_and_writes_nothing(make_world: Any) -> None:
    world = make_world([make_node("gpu-ts", "NVIDIA-L4", gpus=1), make_node("gpu-a100", gpus=1)])
    create_policy(world, sharing_policy("share", "Recommend", strategy="TimeSlicing", replicas=4))
    create_policy(world, sharing_policy("mig", "Recommend", strategy="MIG", migProfile="1g.10gb"))
    pending_pods(world, "nvidia.com/gpu.shared", 2, "s")
    pending_pods(world, "nvidia.com/mig-1g.10gb", 3, "m")
    before = {n: world.node(n) for n in ("gpu-ts", "gpu-a100")}
    world.rounds(3)
    for name, node in before.items():
        assert world.node(name)["metadata"]["labels"] == node["metadata"]["labels"]
        assert world.node(name)["spec"] == node["spec"]
    assert world.configmap() == {}
    share = world.status("share")
    assert [(p["target"], p["state"]) for p in share["proposals"]] == [("Node/gpu-ts", "Proposed")]
    planned = {c["type"]: c for c in share["conditions"]}["LayoutPlanned"]
    assert f"+{config_key(4)} (replicas 4)" in planned["message"]
    assert f"gpu-ts: nvidia.com/device-plugin.config={config_key(4)}" in planned["message"]
    mig = world.status("mig")
    assert [p["action"] for p in mig["proposals"]] == ["layout MIG all-1g.10gb"]


def test_without_prometheus_automatic_stays_recommend(make_world: Any) -> None:
    world = make_world([make_node("gpu-ts", "NVIDIA-L4", gpus=1)], prometheus=False)
    create_policy(world, sharing_policy("share", "Automatic", strategy="TimeSlicing", replicas=4))
    pending_pods(world, "nvidia.com/gpu.shared", 1)
    world.rounds(2)
    assert world.configmap() == {}
    assert "nvidia.com/device-plugin.config" not in world.node("gpu-ts")["metadata"]["labels"]
    assert world.status("share")["proposals"][0]["state"] == "Proposed"


def test_approve_applies_only_approved_nodes(make_world: Any) -> None:
    world = make_world([make_node("gpu-ts", "NVIDIA-L4", gpus=1), make_node("gpu-2", "NVIDIA-L4", gpus=1)])
    create_policy(world, sharing_policy("share", "Approve", strategy="TimeSlicing", replicas=2,
                                        approvals=["Node/gpu-2"]))
    pending_pods(world, "nvidia.com/gpu.shared", 4)
    world.rounds(3)
    labels = {n: world.node(n)["metadata"]["labels"].get("nvidia.com/device-plugin.config")
              for n in ("gpu-ts", "gpu-2")}
    assert labels == {"gpu-ts": None, "gpu-2": config_key(2)}
    states = {p["target"]: p["state"] for p in world.status("share")["proposals"]}
    assert states == {"Node/gpu-ts": "Proposed", "Node/gpu-2": "Applied"}
    assert sorted(world.bound().values(), key=str) == [None, None, "gpu-2", "gpu-2"]


def test_a_missing_configmap_is_reported_with_the_command_and_never_created(make_world: Any) -> None:
    world = make_world([make_node("gpu-ts", "NVIDIA-L4", gpus=1)], configmap=False)
    create_policy(world, sharing_policy("share", "Automatic", strategy="TimeSlicing", replicas=4))
    pending_pods(world, "nvidia.com/gpu.shared", 1)
    world.rounds(2)
    with pytest.raises(client.ApiException) as missing:
        world.cluster.core.read_namespaced_config_map(CONFIGMAP, OPERATOR_NS)
    assert missing.value.status == 404
    assert world.cluster.core.list_namespaced_config_map(OPERATOR_NS).items == []
    condition = {c["type"]: c for c in world.status("share")["conditions"]}["TimeSlicingConfigMap"]
    assert condition["status"] == "False"
    assert "kubectl create configmap time-slicing-config -n gpu-operator" in condition["message"]
    assert world.events("TimeSlicingConfigMapMissing")
    assert "nvidia.com/device-plugin.config" not in world.node("gpu-ts")["metadata"]["labels"]
