"""Sharing layout end to end: the real control plane, its scheduler, and the GPU Operator shim.

Real: the control plane (tests/cluster): kube-apiserver with the chart's GpuPolicy CRD, RBAC and
ServiceAccounts, the default kube-scheduler binding the pods once a node offers what they ask, KWOK
running the nodes; the frame's PolicySync, PolicyStore, Recorder and ReconcileRunner and the
LayoutReconciler, in this process as the chart's controller ServiceAccount, on the real clock. The GPU
Operator is the shim (tests/cluster/gpu_operator.py, running beside the cluster) that reacts to the labels
as the device plugin and the MIG manager do, with the GPU Operator's default MIG config. Faked:
leadership (always leader) and the metrics source (sharing needs one configured to leave Recommend; the
layout reads none).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller.context import ControllerContext, SystemClock
from controller.layout import LayoutReconciler
from controller.loop import ReconcileRunner
from controller.policies import PolicyStore
from controller.policysync import PolicySync
from controller.recorder import ControllerMetrics, Recorder
from gpupolicy.capacity.layout import RELAYOUT_ANNOTATION
from gpupolicy.capacity.timeslicing import config_key
from gpupolicy.model import Mode
from tests.cluster.cache import CaughtUpCache
from tests.cluster.gpu_operator import GpuOperator, parse_plugin_config, shared_replicas
from tests.cluster.objects import make_pod
from tests.controller.conftest import CONTROLLER_CLUSTER, Scene, ScriptedMetrics

CLUSTER = {**CONTROLLER_CLUSTER, "gpu_operator": True}
OPERATOR_NS = "gpu-operator"
CONFIGMAP = "time-slicing-config"
PASS_INTERVAL = 0.3  # seconds between two controller passes (the shim's run every 0.5 s)


def sharing_policy(name: str, mode: str, namespace: str, **sharing: Any) -> dict[str, Any]:
    approvals = sharing.pop("approvals", None)
    spec: dict[str, Any] = {"mode": mode, "sharing": sharing, "selector": {"namespaces": [namespace]}}
    if approvals is not None:
        spec["approvals"] = approvals
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}


class World:
    """The test's part of the cluster, the GPU Operator shim and one controller (runner + layout reconciler)."""

    def __init__(self, scene: Scene, operator: GpuOperator, prometheus: bool = True) -> None:
        self.scene = scene
        self.cluster = scene.cluster
        self.ns = scene.namespace
        self.operator = operator
        api = scene.controller
        clock = SystemClock()
        self.layout = LayoutReconciler(timeout_seconds=300)
        self.ctx = ControllerContext(
            api=api, namespace="kubeon-gpu", default_mode=Mode.RECOMMEND,
            prometheus_url="http://prometheus.test:9090" if prometheus else None,
            metrics=ScriptedMetrics() if prometheus else None, clock=clock,
            recorder=Recorder(api, ControllerMetrics(), clock, "test"), policies=PolicyStore(),
            is_leader=lambda: True)
        self.ctx.cache = CaughtUpCache(api, self.cluster.api_client).start()  # the passes run back to back
        self.runner = ReconcileRunner(self.ctx, [PolicySync(), self.layout])
        self._policies: list[str] = []

    def until(self, done: Callable[[], Any], message: str, timeout: float = 90.0) -> Any:
        """Controller passes until `done()` holds; the scheduler, KWOK and the shim run meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            self.runner.run_all()
            value = done()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {message}")
            time.sleep(PASS_INTERVAL)

    def passes(self, n: int) -> None:
        """`n` more controller passes, the shim's interval apart (after a wait showed the decision made)."""
        for _ in range(n):
            self.runner.run_all()
            time.sleep(max(PASS_INTERVAL, self.operator._loop.interval))

    def node(self, name: str) -> dict[str, Any]:
        return self.scene.admin.sanitize_for_serialization(  # type: ignore[no-any-return]
            self.cluster.core.read_node(name))

    def configmap(self) -> dict[str, str]:
        obj = self.cluster.core.read_namespaced_config_map(CONFIGMAP, OPERATOR_NS)
        return dict(obj.data or {})

    def policy(self, obj: dict[str, Any]) -> None:
        self.cluster.custom.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", obj)
        self._policies.append(obj["metadata"]["name"])

    def status(self, name: str) -> dict[str, Any]:
        obj = self.cluster.custom.get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
        return dict(obj.get("status") or {})

    def condition(self, policy: str, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status(policy).get("conditions") or [] if c["type"] == kind), None)

    def bound(self) -> dict[str, str | None]:
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.cluster.pods(self.ns)}

    def pending(self, count: int) -> None:
        """Wait until `count` pods are pending and the scheduler has tried them (PodScheduled False)."""
        def tried() -> bool:
            pods = self.cluster.pods(self.ns, bound=False)
            return len(pods) == count and all(any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                                                  for c in (p.get("status") or {}).get("conditions") or [])
                                              for p in pods)
        self.cluster.wait_for(tried, timeout=60, message=f"{count} pods the scheduler could not place")

    def events(self, reason: str) -> list[dict[str, Any]]:
        """The controller's Events with this reason about this test's nodes and policies (in `default`, where
        the API server keeps Events about cluster-scoped objects)."""
        uids = {self.cluster.custom.get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
                ["metadata"]["uid"] for name in self._policies}
        return [e for e in self.cluster.events(self.ctx.recorder.namespace, reason)
                if e["involvedObject"].get("uid") in uids
                or (e["involvedObject"].get("kind") == "Node" and e["involvedObject"]["name"].startswith(self.ns))]

    def applied(self) -> list[tuple[str, str]]:
        """The layouts the shim's MIG manager applied on this test's nodes."""
        return [(node, layout) for node, layout in self.operator.applied if node.startswith(self.ns)]

    def errors(self) -> list[str]:
        return [e for e in self.operator.errors if e.startswith(self.ns)]


@pytest.fixture
def make_world(scene: Scene) -> Iterator[Callable[..., World]]:
    """`make_world(nodes, configmap=True, prometheus=True)`: nodes given as (name, product, gpus), made
    `<namespace>-<name>`; the time-slicing ConfigMap (empty) unless `configmap=False`."""
    cluster = scene.cluster
    core = cluster.core
    made: list[World] = []

    def make(nodes: list[tuple[str, str, int]], *, configmap: bool = True, prometheus: bool = True) -> World:
        for name, product, gpus in nodes:
            scene.node(name, product, gpus=gpus)
        if configmap:
            core.create_namespaced_config_map(OPERATOR_NS, {"metadata": {"name": CONFIGMAP}, "data": {}})
        world = World(scene, cluster.gpu_operator, prometheus=prometheus)
        made.append(world)
        return world

    yield make
    for world in made:
        assert world.ctx.cache is not None
        world.ctx.cache.stop()
    # The next test's planner reads every pending pod in the cluster: none of this test's may outlive it.
    core.delete_collection_namespaced_pod(scene.namespace, grace_period_seconds=0)
    cluster.wait_for(lambda: not core.list_namespaced_pod(scene.namespace).items, timeout=60,
                     message="the test's pods gone")
    with contextlib.suppress(ApiException):
        core.delete_namespaced_config_map(CONFIGMAP, OPERATOR_NS)


def pending_pods(world: World, resource: str, count: int, prefix: str = "p") -> None:
    """A user's GPU pods (default scheduler) asking one `resource` each."""
    for i in range(count):
        world.cluster.create(make_pod(f"{prefix}{i}", world.ns, gpus=1, gpu_resource=resource, scheduler_name=None))


def test_time_sliced_pods_get_a_key_a_label_then_allocatable_then_a_node(make_world: Any) -> None:
    world = make_world([("gpu-ts", "NVIDIA-L4", 2)])
    node = f"{world.ns}-gpu-ts"
    world.policy(sharing_policy("share", "Automatic", world.ns, strategy="TimeSlicing", replicas=4))
    pending_pods(world, "nvidia.com/gpu.shared", 6)
    world.pending(6)
    world.until(lambda: set(world.bound().values()) == {node}, "all six pods bound")
    key = config_key(4)
    data = world.configmap()
    assert list(data) == [key]
    config = parse_plugin_config(data[key])  # the device plugin's own fields, unknown ones refused
    assert shared_replicas(config) == (4, True)
    assert config["sharing"]["timeSlicing"]["failRequestsGreaterThanOne"] is True
    labelled = world.node(node)
    assert labelled["metadata"]["labels"]["nvidia.com/device-plugin.config"] == key
    assert labelled["status"]["allocatable"]["nvidia.com/gpu.shared"] == "8"
    assert "nvidia.com/gpu" not in labelled["status"]["allocatable"]
    proposals = world.status("share")["proposals"]
    assert [(p["target"], p["state"]) for p in proposals] == [(f"Node/{node}", "Applied")]
    assert "serves 6 pending time-sliced pods; node is empty" in proposals[0]["reason"]
    assert world.errors() == []


HOLD = "kubeon-test/hold"


def test_an_edited_config_is_a_new_key_and_the_old_one_goes(make_world: Any) -> None:
    """The new pods are held back from the scheduler (a scheduling gate) until the controller has planned:
    without it kube-scheduler puts them at once on the node still sliced 4 ways (it offers
    `nvidia.com/gpu.shared`, whatever the replicas), and the edited config never reaches that node."""
    world = make_world([("gpu-ts", "NVIDIA-L4", 1)])
    node = f"{world.ns}-gpu-ts"
    world.policy(sharing_policy("share", "Automatic", world.ns, strategy="TimeSlicing", replicas=4))
    pending_pods(world, "nvidia.com/gpu.shared", 1)
    world.until(lambda: set(world.bound().values()) == {node}, "the pod bound")
    assert list(world.configmap()) == [config_key(4)]
    world.cluster.core.delete_collection_namespaced_pod(world.ns, grace_period_seconds=0)
    world.cluster.wait_for(lambda: not world.bound(), message="the pods gone")
    world.cluster.custom.patch_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", "share",
                                                     {"spec": {"sharing": {"replicas": 2}}})
    world.cluster.core.patch_namespaced_config_map(CONFIGMAP, OPERATOR_NS, {"data": {"user-key": "version: v1\n"}})
    # the share pods now come from the edited policy: 2 replicas, a node with 4 holds none of them
    for i in range(2):
        held = make_pod(f"q{i}", world.ns, gpus=1, gpu_resource="nvidia.com/gpu.shared",
                        annotations={"gpu.kubeon.io/policy": "share"}, scheduler_name=None)
        held["spec"]["schedulingGates"] = [{"name": HOLD}]
        world.cluster.create(held)
    world.until(lambda: world.node(node)["metadata"]["labels"].get("nvidia.com/device-plugin.config")
                == config_key(2) and sorted(world.configmap()) == sorted([config_key(2), "user-key"]),
                "the node on the new key, the old key gone")
    world.cluster.wait_for(lambda: world.node(node)["status"]["allocatable"].get("nvidia.com/gpu.shared") == "2",
                           message="the device plugin serving the new key")
    for i in range(2):
        world.cluster.core.patch_namespaced_pod(f"q{i}", world.ns, {"spec": {"schedulingGates": None}})
    world.until(lambda: set(world.bound().values()) == {node}, "the held pods bound on the new key")
    assert sorted(world.configmap()) == sorted([config_key(2), "user-key"])  # someone else's key is kept


def test_pending_mig_pods_on_an_empty_a100_get_its_layout(make_world: Any) -> None:
    world = make_world([("gpu-a100", "NVIDIA-A100-SXM4-80GB", 1)])
    name = f"{world.ns}-gpu-a100"
    world.policy(sharing_policy("mig", "Automatic", world.ns, strategy="MIG", migProfile="1g.10gb"))
    pending_pods(world, "nvidia.com/mig-1g.10gb", 7)
    world.pending(7)
    world.until(lambda: set(world.bound().values()) == {name} and not world.node(name)["spec"].get("unschedulable"),
                "seven MIG pods bound on the re-laid-out node")
    node = world.node(name)
    assert node["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"
    assert node["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success"
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    world.until(lambda: RELAYOUT_ANNOTATION not in (world.node(name)["metadata"].get("annotations") or {}),
                "the re-layout record cleared")
    assert world.applied() == [(name, "all-1g.10gb")]
    assert world.configmap() == {}
    assert world.events("MigRelayout")


def test_a_node_holding_a_gpu_pod_is_never_re_laid_out(make_world: Any) -> None:
    world = make_world([("gpu-busy", "NVIDIA-A100-SXM4-80GB", 2)])
    name = f"{world.ns}-gpu-busy"
    world.cluster.create(make_pod("whole", world.ns, gpus=1, scheduler_name=None))
    world.cluster.wait_for(lambda: world.bound().get("whole") == name, message="the whole-GPU pod bound")
    world.policy(sharing_policy("mig", "Automatic", world.ns, strategy="MIG", migProfile="1g.10gb"))
    pending_pods(world, "nvidia.com/mig-1g.10gb", 3)
    world.pending(3)
    planned = world.until(lambda: (c := world.condition("mig", "LayoutPlanned"))
                          and "3 pod(s) no node can serve" in c["message"] and c, "the plan saying so")
    assert planned["status"] == "False"
    world.passes(3)
    node = world.node(name)
    assert "nvidia.com/mig.config" not in node["metadata"]["labels"]
    assert not node["spec"].get("unschedulable")
    assert world.applied() == []


def test_a_failed_layout_is_rolled_back_uncordoned_and_reported(make_world: Any) -> None:
    world = make_world([("gpu-a100", "NVIDIA-A100-SXM4-80GB", 1)])
    name = f"{world.ns}-gpu-a100"
    world.policy(sharing_policy("mig", "Automatic", world.ns, strategy="MIG", migProfile="1g.10gb"))
    world.operator.fail(name, "all-1g.10gb")
    pending_pods(world, "nvidia.com/mig-1g.10gb", 2)
    world.pending(2)
    world.until(lambda: world.node(name)["spec"].get("unschedulable") is True, "the node cordoned first")
    world.until(lambda: not world.node(name)["spec"].get("unschedulable")
                and world.node(name)["metadata"]["labels"].get("nvidia.com/mig.config.state") == "success",
                "rolled back and uncordoned")
    node = world.node(name)
    assert node["metadata"]["labels"]["nvidia.com/mig.config"] == "all-disabled"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    failures = world.events("MigRelayoutFailed")
    assert any("the MIG manager reported failed" in e["message"] for e in failures)
    assert any(e["involvedObject"]["kind"] == "GpuPolicy" for e in failures)


def test_restart_mid_relayout_carries_on_from_the_annotation(make_world: Any) -> None:
    import json

    world = make_world([("gpu-a100", "NVIDIA-A100-SXM4-80GB", 1)])
    name = f"{world.ns}-gpu-a100"
    world.policy(sharing_policy("mig", "Automatic", world.ns, strategy="MIG", migProfile="1g.10gb"))
    pending_pods(world, "nvidia.com/mig-1g.10gb", 7)
    world.pending(7)
    world.runner.run_all()  # cordon + record
    record = json.loads(world.node(name)["metadata"]["annotations"][RELAYOUT_ANNOTATION])
    assert record["step"] == "cordoned" and record["target"] == "all-1g.10gb"
    world.layout = LayoutReconciler(timeout_seconds=300)  # a new process: nothing in memory
    world.ctx.policies = PolicyStore()
    world.runner = ReconcileRunner(world.ctx, [PolicySync(), world.layout])
    world.until(lambda: set(world.bound().values()) == {name} and not world.node(name)["spec"].get("unschedulable"),
                "the re-layout finished by the new process")
    assert world.node(name)["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"


def what_the_controller_writes(node: dict[str, Any]) -> dict[str, Any]:
    """A node's labels, cordon and taints but Kubernetes' own (node lifecycle keeps node.kubernetes.io/* taints
    and copies kubernetes.io/os and /arch to beta.kubernetes.io/* labels some seconds after a node is made)."""
    spec = node["spec"]
    labels = {k: v for k, v in node["metadata"]["labels"].items() if not k.startswith("beta.kubernetes.io/")}
    return {"labels": labels, "unschedulable": bool(spec.get("unschedulable")),
            "taints": [t for t in spec.get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")]}


def test_recommend_shows_the_plan_and_writes_nothing(make_world: Any) -> None:
    world = make_world([("gpu-ts", "NVIDIA-L4", 1), ("gpu-a100", "NVIDIA-A100-SXM4-80GB", 1)])
    ts = f"{world.ns}-gpu-ts"
    world.policy(sharing_policy("share", "Recommend", world.ns, strategy="TimeSlicing", replicas=4))
    world.policy(sharing_policy("mig", "Recommend", world.ns, strategy="MIG", migProfile="1g.10gb"))
    pending_pods(world, "nvidia.com/gpu.shared", 2, "s")
    pending_pods(world, "nvidia.com/mig-1g.10gb", 3, "m")
    world.pending(5)
    before = {n: what_the_controller_writes(world.node(n)) for n in (ts, f"{world.ns}-gpu-a100")}
    world.until(lambda: world.status("share").get("proposals") and world.status("mig").get("proposals"),
                "both plans shown")
    world.passes(3)
    for name, node in before.items():
        assert what_the_controller_writes(world.node(name)) == node
    assert world.configmap() == {}
    share = world.status("share")
    assert [(p["target"], p["state"]) for p in share["proposals"]] == [(f"Node/{ts}", "Proposed")]
    planned = {c["type"]: c for c in share["conditions"]}["LayoutPlanned"]
    assert f"+{config_key(4)} (replicas 4)" in planned["message"]
    assert f"{ts}: nvidia.com/device-plugin.config={config_key(4)}" in planned["message"]
    mig = world.status("mig")
    assert [p["action"] for p in mig["proposals"]] == ["layout MIG all-1g.10gb"]
    assert [w for w in world.scene.writes() if "/nodes/" in w[1] or "/configmaps" in w[1]] == []


def test_without_prometheus_automatic_stays_recommend(make_world: Any) -> None:
    world = make_world([("gpu-ts", "NVIDIA-L4", 1)], prometheus=False)
    node = f"{world.ns}-gpu-ts"
    world.policy(sharing_policy("share", "Automatic", world.ns, strategy="TimeSlicing", replicas=4))
    pending_pods(world, "nvidia.com/gpu.shared", 1)
    world.pending(1)
    proposals = world.until(lambda: world.status("share").get("proposals"), "the plan shown")
    world.passes(2)
    assert world.configmap() == {}
    assert "nvidia.com/device-plugin.config" not in world.node(node)["metadata"]["labels"]
    assert proposals[0]["state"] == "Proposed" and world.status("share")["proposals"][0]["state"] == "Proposed"


def test_approve_applies_only_approved_nodes(make_world: Any) -> None:
    world = make_world([("gpu-ts", "NVIDIA-L4", 1), ("gpu-2", "NVIDIA-L4", 1)])
    ts, two = f"{world.ns}-gpu-ts", f"{world.ns}-gpu-2"
    world.policy(sharing_policy("share", "Approve", world.ns, strategy="TimeSlicing", replicas=2,
                                approvals=[f"Node/{two}"]))
    pending_pods(world, "nvidia.com/gpu.shared", 4)
    world.pending(4)
    world.until(lambda: sorted(world.bound().values(), key=str) == [None, None, two, two],
                "two pods on the approved node")
    world.passes(2)
    labels = {n: world.node(n)["metadata"]["labels"].get("nvidia.com/device-plugin.config") for n in (ts, two)}
    assert labels == {ts: None, two: config_key(2)}
    states = {p["target"]: p["state"] for p in world.status("share")["proposals"]}
    assert states == {f"Node/{ts}": "Proposed", f"Node/{two}": "Applied"}
    assert sorted(world.bound().values(), key=str) == [None, None, two, two]


def test_a_missing_configmap_is_reported_with_the_command_and_never_created(make_world: Any) -> None:
    world = make_world([("gpu-ts", "NVIDIA-L4", 1)], configmap=False)
    node = f"{world.ns}-gpu-ts"
    world.policy(sharing_policy("share", "Automatic", world.ns, strategy="TimeSlicing", replicas=4))
    pending_pods(world, "nvidia.com/gpu.shared", 1)
    world.pending(1)
    condition = world.until(lambda: world.condition("share", "TimeSlicingConfigMap"), "the ConfigMap condition")
    world.passes(2)
    with pytest.raises(client.ApiException) as missing:
        world.cluster.core.read_namespaced_config_map(CONFIGMAP, OPERATOR_NS)
    assert missing.value.status == 404
    assert [w for w in world.scene.writes() if "/configmaps" in w[1]] == [], "never created"
    assert condition["status"] == "False"
    assert "kubectl create configmap time-slicing-config -n gpu-operator" in condition["message"]
    assert world.events("TimeSlicingConfigMapMissing")
    assert "nvidia.com/device-plugin.config" not in world.node(node)["metadata"]["labels"]
