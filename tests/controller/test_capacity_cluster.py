"""GPU capacity end to end: the test API server, its Karpenter, scheduler, workload and GPU Operator stand-ins.

Real: the test API server (tests/kubeapi) with the GpuPolicy CRD and
Karpenter's own karpenter.sh/v1 NodePool and NodeClaim CRDs (objects are
schema-validated and pruned on write), its Eviction API with the
PodDisruptionBudget arithmetic, server-side apply with managedFields; the
scheduler, workload and kubelet stand-ins; the Karpenter stand-in
(NodeClaim -> Node, deletion drains and terminates); the GPU Operator
stand-in (time-slicing and MIG from node labels); the frame's PolicySync,
PolicyStore, Recorder and ReconcileRunner with the Layout and Capacity
reconcilers; real Prometheus with scripted DCGM series for usage. Faked:
leadership (always leader, but where a test takes the lease away) and, except with
Prometheus, the clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.capacity import CapacityReconciler
from controller.context import ControllerContext
from controller.layout import LayoutReconciler
from controller.loop import ReconcileRunner
from controller.metrics_source import from_url
from controller.policies import PolicyStore
from controller.policysync import PolicySync
from controller.recorder import ControllerMetrics, Recorder
from gpupolicy.capacity.drain import DRAINING_ANNOTATION, UNDONE_ANNOTATION, read_record
from gpupolicy.model import Mode
from gpupolicy.proposals import proposal_id
from tests.controller.conftest import FakeClock, ScriptedMetrics
from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_deployment, make_node, make_nodeclaim, make_pdb, make_pod
from tests.cluster.gpu_operator import GpuOperator
from tests.kubeapi.karpenter import check_against_crd
from tests.kubeapi.scheduler import read_items
from tests.promharness import DcgmExporter, PrometheusServer, constant, gpu_labels

CRD = "manifests/crd/gpupolicies.gpu.kubeon.io.yaml"
NS = "ml"
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
UTIL = "DCGM_FI_DEV_GPU_UTIL"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def capacity_policy(name: str = "gpu-capacity", mode: str = "Automatic", *, models: list[str] | None = None,
                    max_gpus: int | None = 64, approvals: list[str] | None = None,
                    **consolidation: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "nodePool": "gpu", "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
        "gpuModels": models or ["NVIDIA-L4", "NVIDIA-A10G", "NVIDIA-A100-SXM4-80GB"],
        "consolidation": {"underusedBelowPercent": 10, "for": "10m", "maxDisruptedNodes": 1, "emptyFor": "1m",
                          "drainTimeout": "5m", **consolidation}}
    if max_gpus is not None:
        body["maxGpus"] = max_gpus
    spec: dict[str, Any] = {"mode": mode, "capacity": body}
    if approvals:
        spec["approvals"] = approvals
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name}, "spec": spec}


def sharing_policy(name: str, strategy: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": name},
            "spec": {"mode": "Automatic", "sharing": {"strategy": strategy, **extra}}}


class World:
    """A cluster with Karpenter and the GPU Operator, and one controller (policy sync, layout, capacity)."""

    def __init__(self, cluster: Cluster, *, prometheus: PrometheusServer | None = None,
                 clock: Any = None, checkpoint: Callable[[str], None] | None = None) -> None:
        self.cluster = cluster
        api = cluster.api_client
        assert api is not None
        self.api = api
        self.clock = clock or FakeClock(start=time.time())  # node and pod timestamps are wall-clock
        self.operator = GpuOperator(api)
        metrics = from_url(prometheus.url) if prometheus else None
        self.ctx = ControllerContext(
            api=api, namespace="kubeon-gpu", default_mode=Mode.RECOMMEND,
            prometheus_url=prometheus.url if prometheus else None, metrics=metrics, clock=self.clock,
            recorder=Recorder(api, ControllerMetrics(), self.clock, "test"), policies=PolicyStore(),
            is_leader=lambda: True)
        # Sharing policies need a metrics source to leave Recommend; the layout reads none, and the
        # scripted one has no DCGM series (no usage known: no usage-aware consolidation).
        if metrics is None:
            self.ctx.metrics, self.ctx.prometheus_url = ScriptedMetrics(), "http://prometheus.test:9090"
        self.restart(checkpoint)

    def restart(self, checkpoint: Callable[[str], None] | None = None) -> None:
        """A new controller process: fresh reconcilers and policy store (what survives is in the API)."""
        self.ctx.policies = PolicyStore()
        # 30 s steps: a hole is > 90 s, so the few seconds between the backfilled history and the first
        # live scrape (longer on a loaded machine) never read as missing data.
        self.capacity = CapacityReconciler(step_seconds=30.0, checkpoint=checkpoint)
        self.runner = ReconcileRunner(self.ctx, [PolicySync(), LayoutReconciler(timeout_seconds=300),
                                                 self.capacity])

    def rounds(self, n: int = 4, advance: float = 10.0) -> None:
        for _ in range(n):
            self.runner.run_all()
            self.operator.reconcile_once()
            self.cluster.settle()
            if isinstance(self.clock, FakeClock):
                self.clock.advance(advance)

    # -- reading
    def claims(self) -> dict[str, dict[str, Any]]:
        items = read_items(self.cluster.custom.list_cluster_custom_object(
            "karpenter.sh", "v1", "nodeclaims", _preload_content=False))
        return {c["metadata"]["name"]: c for c in items}

    def nodepool(self) -> dict[str, Any] | None:
        items = read_items(self.cluster.custom.list_cluster_custom_object(
            "karpenter.sh", "v1", "nodepools", _preload_content=False))
        return next((p for p in items if p["metadata"]["name"] == "gpu"), None)

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["metadata"]["name"]: n for n in read_items(self.cluster.core.list_node(_preload_content=False))}

    def bound(self) -> dict[str, str | None]:
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.cluster.pods(NS)}

    def status(self, name: str = "gpu-capacity") -> dict[str, Any]:
        obj = self.cluster.custom.get_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", name)
        return dict(obj.get("status") or {})

    def proposals(self, name: str = "gpu-capacity") -> list[dict[str, Any]]:
        return list(self.status(name).get("proposals") or [])

    def condition(self, kind: str, name: str = "gpu-capacity") -> dict[str, Any]:
        return next(c for c in self.status(name)["conditions"] if c["type"] == kind)

    def create_policy(self, obj: dict[str, Any]) -> None:
        self.cluster.custom.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", obj)

    def launch(self, name: str, instance_type: str = "p4de.24xlarge") -> None:
        """A GPU node of the pool that Karpenter launched earlier (a NodeClaim, then its Node)."""
        from tests.cluster.objects import make_nodeclaim

        self.cluster.create(make_nodeclaim(name, instance_type, nodepool="gpu",
                                           taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]))
        self.settle()

    def settle(self) -> None:
        """The cluster settled, and the fake clock caught up with the wall clock, never back.

        The API server stamps objects (a Node's creation, a pod's PodScheduled) on the wall clock; in a
        cluster the controller's clock is never behind the objects it reads. A fake clock left behind by a
        slow set-up read a pod bound a second later as younger than the test's window.
        """
        self.cluster.settle()
        if isinstance(self.clock, FakeClock):
            self.clock.advance(max(0.0, time.time() - self.clock.now()))


@pytest.fixture
def make_world() -> Iterator[Callable[..., World]]:
    opened: list[Cluster] = []

    def make(nodes: list[dict[str, Any]] | None = None, **kw: Any) -> World:
        cluster = Cluster(nodes=nodes or [make_node("cpu-1", None, 0)], crd_files=[CRD],
                          background=False).__enter__()
        opened.append(cluster)
        for ns in (NS, "gpu-operator", "kubeon-gpu"):
            cluster.ensure_namespace(ns)
        cluster.core.create_namespaced_config_map("gpu-operator", {"metadata": {"name": "time-slicing-config"},
                                                                   "data": {}})
        assert cluster.karpenter is not None
        cluster.karpenter.evict_retry = 0.0
        return World(cluster, **kw)

    yield make
    for cluster in opened:
        cluster.close()


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def gpu_pods(world: World, count: int, resource: str, prefix: str = "p") -> None:
    for i in range(count):
        world.cluster.create(make_pod(f"{prefix}{i}", NS, gpus=1, gpu_resource=resource, tolerations=TOLERATE_GPU))


# -- provisioning --------------------------------------------------------------------------
def test_pending_time_sliced_burst_gets_a_nodepool_and_nodeclaims_once(make_world: Any) -> None:
    world = make_world()
    world.create_policy(sharing_policy("share", "TimeSlicing", replicas=4))
    world.create_policy(capacity_policy(models=["NVIDIA-L4"], max_gpus=16))
    gpu_pods(world, 50, "nvidia.com/gpu.shared")
    world.settle()
    world.runner.run_all()
    pool = world.nodepool()
    assert pool is not None
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "16"}
    template = pool["spec"]["template"]["spec"]
    assert template["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert template["requirements"][0] == {"key": "node.kubernetes.io/instance-type", "operator": "In",
                                           "values": ["g6.xlarge"]}
    assert pool["spec"]["disruption"]["budgets"] == [{"nodes": "1"}]
    managers = {m["manager"] for m in pool["metadata"]["managedFields"]}
    assert managers == {"kubeon-gpu-optimizer"} and pool["metadata"]["managedFields"][0]["operation"] == "Apply"
    claims = world.claims()
    assert len(claims) == 13  # 50 shares at 4 per L4 GPU, one L4 per g6.xlarge
    for claim in claims.values():
        check_against_crd(claim, "nodeclaims")
        assert claim["metadata"]["labels"]["karpenter.sh/nodepool"] == "gpu"
    check_against_crd(pool, "nodepools")
    world.runner.run_all()  # the next pass counts the launching claims: no second set
    world.runner.run_all()
    assert set(world.claims()) == set(claims)
    launches = [p for p in world.proposals() if p["action"].startswith("launch NodeClaim")]
    assert len(launches) == 13 and {p["state"] for p in launches} == {"Applied"}
    world.rounds(6)
    assert set(world.claims()) == set(claims)  # nodes registered, pods bound: nothing more launched
    assert all(node is not None for node in world.bound().values()), world.bound()
    assert set(world.bound().values()) <= set(claims)


def test_max_gpus_caps_the_launches_and_says_so(make_world: Any) -> None:
    world = make_world()
    world.create_policy(sharing_policy("share", "TimeSlicing", replicas=4))
    world.create_policy(capacity_policy(models=["NVIDIA-L4"], max_gpus=3))
    gpu_pods(world, 20, "nvidia.com/gpu.shared")
    world.rounds(2)
    assert len(world.claims()) == 3
    unserved = world.condition("Provisioned")
    assert (unserved["status"], unserved["reason"]) == ("False", "Unserved")
    assert "8 pending pod(s) get no node (maxGpus 3 reached)" in unserved["message"]


def test_pending_mig_pods_get_a_nodeclaim_sized_and_labelled_for_them(make_world: Any) -> None:
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    world.create_policy(capacity_policy(models=["NVIDIA-A100-SXM4-80GB"]))
    gpu_pods(world, 10, "nvidia.com/mig-1g.10gb")
    world.settle()
    world.runner.run_all()
    [(name, claim)] = world.claims().items()
    requirement = claim["spec"]["requirements"][0]
    assert requirement["values"] == ["p4de.24xlarge"]  # 10 x 1/7 GPU: one 8-GPU A100-80GB node
    assert claim["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"
    world.rounds(5)
    node = world.nodes()[name]
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "56"
    assert set(world.bound().values()) == {name}
    assert list(world.claims()) == [name]


# -- consolidation ---------------------------------------------------------------------------
def two_nodes_one_pod_each(world: World, **pod_kw: Any) -> None:
    """gpu-a and gpu-b (8 GPUs each), one 1-GPU Deployment pod on each (the other node cordoned meanwhile)."""
    world.launch("gpu-a")
    world.launch("gpu-b")
    for name, other in (("job-a", "gpu-b"), ("job-b", "gpu-a")):
        world.cluster.core.patch_node(other, {"spec": {"unschedulable": True}})
        world.cluster.create(make_deployment(name, NS, 1, gpus=1, tolerations=TOLERATE_GPU, **pod_kw))
        world.settle()
        world.cluster.core.patch_node(other, {"spec": {"unschedulable": None}})
    assert sorted(world.bound().values()) == ["gpu-a", "gpu-b"]


def test_an_idle_gpu_node_whose_pods_fit_elsewhere_is_drained_and_its_nodeclaim_deleted(
        make_world: Any, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer]) -> None:
    dcgm_exporter.put(UTIL, gpu_labels(namespace=NS, pod="job-a", host="gpu-a"), constant(3))
    dcgm_exporter.put(UTIL, gpu_labels(namespace=NS, pod="job-b", host="gpu-b"), constant(60))
    prom = prometheus_factory(history=900, step=5)

    class Wall:
        def now(self) -> float:
            return time.time()

    world = make_world(prometheus=prom, clock=Wall())
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    world.rounds(1)
    drained = [p for p in world.proposals() if p["target"] == "Node/gpu-a"]
    assert drained, world.proposals()
    assert "gpu-a: 1 pod, GPU util 3% for 10min; it fits on gpu-b" in json.dumps(drained)
    world.rounds(3)
    assert "gpu-a" not in world.claims() and "gpu-a" not in world.nodes()
    assert set(world.bound().values()) == {"gpu-b"}
    assert "gpu-b" in world.claims() and not world.nodes()["gpu-b"]["spec"].get("unschedulable")


def pdb_status(world: World, name: str, allowed: int) -> None:
    """What the disruption controller (the test API server runs none) writes: status.disruptionsAllowed,
    through the status subresource. The Eviction API of the test server counts the pods itself."""
    world.cluster.policy.patch_namespaced_pod_disruption_budget_status(
        name, NS, {"status": {"disruptionsAllowed": allowed}}, _preload_content=False)


def test_a_pdb_refusing_an_eviction_its_status_allowed_blocks_the_drain_then_it_is_undone_and_reported(
        make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    for name in ("job-a", "job-b"):
        world.cluster.create(make_pdb(f"{name}-pdb", NS, match_labels={"app": name}, min_available=1))
        # a status behind the pods (one disruption allowed when it was computed): the drain starts, and the
        # Eviction API, counting again, refuses; the drain's own bound is the backstop
        pdb_status(world, f"{name}-pdb", 1)
    world.rounds(1, advance=30)
    draining = [n for n, node in world.nodes().items() if DRAINING_ANNOTATION in annotations(node)]
    assert len(draining) == 1
    [victim] = draining
    assert world.nodes()[victim]["spec"]["unschedulable"] is True
    record = read_record(annotations(world.nodes()[victim]))
    assert record is not None and "refused (429)" in record.blocked
    world.rounds(4, advance=30)  # retries within the 5 min bound: still cordoned, pod still there
    assert world.nodes()[victim]["spec"].get("unschedulable") is True
    world.rounds(8, advance=30)
    node = world.nodes()[victim]
    assert not node["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(node)
    assert UNDONE_ANNOTATION in annotations(node)
    assert set(world.claims()) == {"gpu-a", "gpu-b"} and sorted(world.bound().values()) == ["gpu-a", "gpu-b"]
    undone = [p for p in world.proposals() if p["action"] == "drain undone"]
    assert [p["target"] for p in undone] == [f"Node/{victim}"]
    assert "not finished within 300s" in undone[0]["reason"] and "Cannot evict pod" in undone[0]["reason"]
    warnings = world.cluster.events("kubeon-gpu", "CapacityDrainUndone")
    assert warnings and all(e["type"] == "Warning" for e in warnings)
    world.rounds(2, advance=30)  # cooling down: the same node is not drained again at once
    assert DRAINING_ANNOTATION not in annotations(world.nodes()[victim])


def test_a_node_whose_pod_a_pdb_protects_is_not_drained_until_the_pdb_allows_a_disruption(
        make_world: Any) -> None:
    """Karpenter's rule: a node holding a pod whose PodDisruptionBudget allows no disruption is no candidate.
    Before, the node was cordoned and its other pod evicted, then the budget's 429 held the drain until
    drainTimeout, it was undone and the next node drained: evictions for nothing."""
    world = make_world()
    world.create_policy(capacity_policy())
    world.launch("gpu-a")
    world.launch("gpu-b")
    # guarded and free on gpu-a, big (which stays: do-not-disrupt) on gpu-b; the other node cordoned meanwhile
    for name, gpus, other, notes in (("guarded", 1, "gpu-b", None), ("free", 1, "gpu-b", None),
                                     ("big", 4, "gpu-a", {"karpenter.sh/do-not-disrupt": "true"})):
        world.cluster.core.patch_node(other, {"spec": {"unschedulable": True}})
        world.cluster.create(make_deployment(name, NS, 1, gpus=gpus, tolerations=TOLERATE_GPU, pod_annotations=notes))
        world.settle()
        world.cluster.core.patch_node(other, {"spec": {"unschedulable": None}})
    before = world.bound()
    assert sorted(before.values()) == ["gpu-a", "gpu-a", "gpu-b"]
    world.cluster.create(make_pdb("guarded-pdb", NS, match_labels={"app": "guarded"}, min_available=1))
    pdb_status(world, "guarded-pdb", 0)  # one pod, minAvailable 1
    for _ in range(12):  # past drainTimeout (5m): nothing started, so nothing to undo
        world.rounds(1, advance=30)
        node = world.nodes()["gpu-a"]
        assert not node["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(node)
        assert UNDONE_ANNOTATION not in annotations(node)
        assert world.bound() == before  # no pod evicted (a Deployment's new pod has a new name)
    held = [p for p in world.proposals() if p["target"] == "Node/gpu-a"]
    assert held and all(p["state"] != "Applied" for p in held), held
    assert "not a candidate this pass: pdb ml/guarded-pdb prevents pod evictions" in held[0]["reason"], held
    assert set(world.claims()) == {"gpu-a", "gpu-b"}
    # the budget changes and its controller says one disruption is allowed: gpu-a is consolidated
    world.cluster.policy.patch_namespaced_pod_disruption_budget(
        "guarded-pdb", NS, {"spec": {"minAvailable": 0}}, _preload_content=False)
    pdb_status(world, "guarded-pdb", 1)
    world.rounds(4, advance=30)
    assert "gpu-a" not in world.claims() and "gpu-a" not in world.nodes()
    assert set(world.bound().values()) == {"gpu-b"}


def test_a_do_not_disrupt_pod_keeps_its_node(make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world, pod_annotations={"karpenter.sh/do-not-disrupt": "true"})
    world.rounds(4)
    assert set(world.claims()) == {"gpu-a", "gpu-b"}
    assert all(not n["spec"].get("unschedulable") for n in world.nodes().values() if n["metadata"]["name"] != "cpu-1")
    assert not [p for p in world.proposals() if p["target"].startswith("Node/")]


def test_pods_that_would_not_fit_elsewhere_keep_the_node(make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy())
    world.launch("gpu-a")
    world.launch("gpu-b")
    for name in ("big-a", "big-b"):
        world.cluster.create(make_deployment(name, NS, 1, gpus=5, tolerations=TOLERATE_GPU))
    world.rounds(4)
    assert sorted(world.bound().values()) == ["gpu-a", "gpu-b"]
    assert set(world.claims()) == {"gpu-a", "gpu-b"}
    assert not [p for p in world.proposals() if p["target"].startswith("Node/")]


def kept_node_and_pod_on_gpu_a(make_world: Any, pod: str) -> World:
    """Two pool nodes with emptyFor 1m: gpu-b kept by a Deployment's pod, gpu-a holding the bare pod `pod`."""
    world = make_world()
    world.create_policy(capacity_policy(emptyFor="1m"))
    world.launch("gpu-a")
    world.launch("gpu-b")
    world.cluster.create(make_deployment("keep", NS, 1, gpus=8, tolerations=TOLERATE_GPU,
                                         node_selector={"kubernetes.io/hostname": "gpu-b"}))
    world.cluster.create(make_pod(pod, NS, gpus=8, tolerations=TOLERATE_GPU,
                                  node_selector={"kubernetes.io/hostname": "gpu-a"}))
    world.settle()
    return world


def test_a_node_whose_gpu_pods_finished_is_removed_within_one_loop_after_the_grace(make_world: Any) -> None:
    world = kept_node_and_pod_on_gpu_a(make_world, "train")
    assert world.bound()["train"] == "gpu-a"
    finished = world.clock.now() - 5
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(finished))
    world.cluster.core.patch_namespaced_pod_status("train", NS, {"status": {"phase": "Succeeded", "containerStatuses": [
        {"name": "main", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"terminated": {"exitCode": 0, "finishedAt": stamp}}}]}})
    world.runner.run_all()
    assert "gpu-a" in world.claims()  # within the grace
    world.clock.advance(60)
    world.runner.run_all()  # one loop after the grace: the claim is deleted
    claim = world.claims().get("gpu-a")
    assert claim is None or claim["metadata"].get("deletionTimestamp")
    world.settle()
    assert "gpu-a" not in world.nodes() and "gpu-b" in world.nodes()


def test_recommend_writes_nothing(make_world: Any) -> None:
    world = make_world()
    world.launch("gpu-a")
    world.create_policy(sharing_policy("mig", "MIG", gpuModels=["NVIDIA-H100-80GB-HBM3"]))
    world.create_policy(capacity_policy(mode="Recommend", models=["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]))
    gpu_pods(world, 3, "nvidia.com/mig-1g.10gb")
    world.rounds(1)
    before_nodes = {n: (v["metadata"].get("annotations"), v["spec"].get("unschedulable"))
                    for n, v in world.nodes().items()}
    world.rounds(3, advance=120)
    assert world.nodepool() is None
    assert set(world.claims()) == {"gpu-a"}
    assert {n: (v["metadata"].get("annotations"), v["spec"].get("unschedulable"))
            for n, v in world.nodes().items()} == before_nodes
    actions = {(p["target"], p["action"].split(" (")[0].split(" NodeClaim")[0], p["state"]) for p in world.proposals()}
    assert ("NodePool/gpu", "declare NodePool gpu", "Proposed") in actions
    assert ("NodePool/gpu", "launch", "Proposed") in actions
    assert ("Node/gpu-a", "delete", "Proposed") in actions  # empty for longer than emptyFor


def test_approve_applies_only_the_approved_targets(make_world: Any) -> None:
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    world.create_policy(capacity_policy(mode="Approve", approvals=["NodePool/gpu"],
                                        models=["NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"]))
    world.launch("gpu-idle", "g6.xlarge")  # an L4: no MIG, so the layout cannot use it for the pods
    gpu_pods(world, 2, "nvidia.com/mig-3g.40gb")
    world.rounds(1)
    assert world.nodepool() is not None and len(world.claims()) == 2  # the idle node and one launch
    world.rounds(2, advance=120)
    assert "gpu-idle" in world.claims()  # Node/gpu-idle is not approved: proposed only
    idle = [p for p in world.proposals() if p["target"] == "Node/gpu-idle"]
    assert idle and {p["state"] for p in idle} == {"Proposed"}


def test_killing_the_controller_mid_drain_converges(make_world: Any) -> None:
    class Crash(Exception):
        pass

    def crash_after_eviction(step: str) -> None:
        if step == "evicted":
            raise Crash(step)

    world = make_world(checkpoint=crash_after_eviction)
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    originals = {p["metadata"]["name"]: p["metadata"]["uid"] for p in world.cluster.pods(NS)}
    with pytest.raises(Crash):
        world.runner.ctx.policies.replace_all([])  # nothing carried in memory but what the API holds
        for reconciler in world.runner.reconcilers:
            reconciler.reconcile(world.ctx)
    cordoned = [n for n, v in world.nodes().items() if v["spec"].get("unschedulable")]
    assert len(cordoned) == 1
    [victim] = cordoned
    assert DRAINING_ANNOTATION in annotations(world.nodes()[victim])
    world.restart()  # the next leader: no memory of the drain but the node's annotation
    world.rounds(4)
    assert victim not in world.claims() and victim not in world.nodes()
    pods = world.cluster.pods(NS)
    assert len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods)
    replaced = [p for p in pods if p["metadata"]["uid"] not in originals.values()]
    assert len(replaced) == 1  # the one evicted pod was replaced once: evicted once for the plan
    assert all(not v["spec"].get("unschedulable") for v in world.nodes().values())


def test_a_pending_pod_is_provisioned_for_once_by_the_first_policy_covering_it(make_world: Any) -> None:
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    first = capacity_policy("first", models=["NVIDIA-A100-SXM4-80GB"])
    first["spec"].update({"priority": 10, "selector": {"namespaces": [NS]}})
    second = capacity_policy("second", models=["NVIDIA-A100-SXM4-80GB"])
    second["spec"]["capacity"]["nodePool"] = "gpu-other"
    world.create_policy(first)
    world.create_policy(second)
    gpu_pods(world, 4, "nvidia.com/mig-1g.10gb")
    world.rounds(1)
    pools = [c["metadata"]["labels"]["karpenter.sh/nodepool"] for c in world.claims().values()]
    assert pools == ["gpu"]
    assert not [p for p in world.proposals("second") if p["action"].startswith("launch")]


def test_a_drain_whose_pods_no_longer_fit_elsewhere_is_undone(make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    for name in ("job-a", "job-b"):
        world.cluster.create(make_pdb(f"{name}-pdb", NS, match_labels={"app": name}, min_available=1))
        pdb_status(world, f"{name}-pdb", 1)  # a status behind the pods: the drain starts, the eviction is refused
    world.rounds(1, advance=1)
    [victim] = [n for n, node in world.nodes().items() if DRAINING_ANNOTATION in annotations(node)]
    other = ({"gpu-a", "gpu-b"} - {victim}).pop()
    world.cluster.create(make_pod("filler", NS, gpus=7, tolerations=TOLERATE_GPU))  # the other node is full now
    world.settle()
    assert world.bound()["filler"] == other
    world.rounds(1, advance=1)
    node = world.nodes()[victim]
    assert not node["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(node)
    undone = [p for p in world.proposals() if p["action"] == "drain undone"]
    assert undone and "no longer fit on the other nodes" in undone[0]["reason"]


def test_a_node_emptied_by_deleting_its_pods_also_gets_the_grace(make_world: Any) -> None:
    world = kept_node_and_pod_on_gpu_a(make_world, "job")
    world.clock.advance(600)  # the node is old: its creation says nothing about when it emptied
    world.runner.run_all()
    world.cluster.core.delete_namespaced_pod("job", NS)
    world.runner.run_all()
    world.clock.advance(30)
    world.runner.run_all()
    assert "gpu-a" in world.claims() and not world.claims()["gpu-a"]["metadata"].get("deletionTimestamp")
    world.clock.advance(31)
    world.runner.run_all()
    world.settle()
    assert "gpu-a" not in world.claims() and "gpu-b" in world.claims()


# -- the core's optional inputs, built from live objects -------------------------------------------
def set_evictions(world: World, records: dict[str, Any], name: str = "gpu-capacity") -> None:
    """status.evictions as earlier drains left it (the controller's own record, written through the API)."""
    world.cluster.custom.patch_cluster_custom_object_status(
        "gpu.kubeon.io", "v1alpha1", "gpupolicies", name, {"status": {"evictions": records}})


class Crash(Exception):
    """The controller dying at a checkpoint (the in-process stand-in for tests/..._crash_process.py's kill)."""


def crash_at(checkpoint: str) -> Callable[[str], None]:
    def hook(step: str) -> None:
        if step == checkpoint:
            raise Crash(step)
    return hook


def one_pass_until_the_crash(world: World) -> None:
    with pytest.raises(Crash):  # the runner would log and carry on: call the reconcilers as a process does
        for reconciler in world.runner.reconcilers:
            reconciler.reconcile(world.ctx)


def test_evictions_are_counted_per_workload_once_across_a_crash_and_the_pods_re_creation(
        make_world: Any) -> None:
    world = make_world(checkpoint=crash_at("evicted"))
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    before = {p["metadata"]["name"] for p in world.cluster.pods(NS)}
    one_pass_until_the_crash(world)
    [(key, record)] = world.status().get("evictions", {}).items()
    assert record["count"] == 0 and len(record["pending"]) == 1  # asked, not yet counted: the crash
    world.restart()
    world.rounds(4)
    after = {p["metadata"]["name"] for p in world.cluster.pods(NS)}
    assert len(after - before) == 1  # the evicted pod came back under a new name
    records = world.status()["evictions"]
    assert list(records) == [key] and key in ("Deployment/ml/job-a", "Deployment/ml/job-b")
    assert records[key]["count"] == 1 and records[key]["pending"] == [] and len(records[key]["evicted"]) == 1


def test_a_workload_evicted_max_evictions_per_pod_times_pins_its_node(make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy())
    world.rounds(1)
    set_evictions(world, {"Deployment/ml/job-a": {"count": 3, "at": world.clock.now()}})
    two_nodes_one_pod_each(world)
    world.rounds(4)
    # without the count gpu-a (first of two equal candidates) would go; pinned, gpu-b goes instead
    assert "gpu-a" in world.claims() and "gpu-b" not in world.claims()
    assert set(world.bound().values()) == {"gpu-a"}
    assert world.status()["evictions"]["Deployment/ml/job-b"]["count"] == 1
    assert world.status()["evictions"]["Deployment/ml/job-a"]["count"] == 3


# -- against the Karpenter stand-in's NodePool accounting -----------------------------------------
def test_the_controller_keeps_within_max_gpus_where_karpenters_own_count_cannot_see_shared_gpus(
        make_world: Any) -> None:
    """Upstream Karpenter checks a NodePool's limits only in its own provisioner (a NodeClaim created by
    anyone else launches whatever the limits say), and counts status.resources from each node's capacity
    once initialized: a time-sliced node advertises nvidia.com/gpu.shared, not nvidia.com/gpu. So the
    controller counts the GPUs of the pool's claims by instance type itself, and lowers the limit it
    writes by the GPUs Karpenter's count misses."""
    world = make_world()
    world.create_policy(sharing_policy("share", "TimeSlicing", replicas=4))
    world.create_policy(capacity_policy(models=["NVIDIA-L4"], max_gpus=3))
    gpu_pods(world, 20, "nvidia.com/gpu.shared")
    world.rounds(8)
    gpu_pods(world, 8, "nvidia.com/gpu.shared", prefix="late")
    world.rounds(4)
    claims = world.claims()
    assert len(claims) == 3
    conditions = [{c["type"]: c["status"] for c in claim["status"]["conditions"]} for claim in claims.values()]
    assert conditions == [{"Launched": "True", "Registered": "True", "Initialized": "True", "Ready": "True"}] * 3
    pool = world.nodepool()
    assert pool is not None
    resources = pool["status"]["resources"]
    assert (resources["nodes"], pool["status"]["nodes"]) == ("3", 3)
    assert resources["nvidia.com/gpu.shared"] == "12" and "nvidia.com/gpu" not in resources
    # so the limit written for Karpenter's own (whole-GPU) provisioning is maxGpus less what it cannot see
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "0"}
    [declared] = [p for p in world.proposals() if p["action"] == "declare NodePool gpu"]
    assert "limits nvidia.com/gpu=0 (maxGpus 3 less 3 GPU(s) on 3 time-sliced or MIG node(s)" in declared["reason"]
    assert sum(int(claim["status"]["capacity"]["nvidia.com/gpu"]) for claim in claims.values()) == 3
    assert len([p for p, node in world.bound().items() if node]) == 12
    unserved = world.condition("Provisioned")
    assert (unserved["status"], unserved["reason"]) == ("False", "Unserved")
    assert "16 pending pod(s) get no node (maxGpus 3 reached)" in unserved["message"]


def test_a_node_whose_pods_fit_on_a_cheaper_new_node_is_replaced_launching_before_the_drain(
        make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy(**{"for": "10m"}))
    world.launch("gpu-big")  # p4de.24xlarge: 8 A100-80GB
    # the same plan undone long ago (past its cool-down): says nothing about this replacement
    plan = proposal_id("gpu-capacity", "Node/gpu-big", "replace (single-node)")
    old = json.dumps({"at": world.clock.now() - 7200, "plan": plan, "policy": "gpu-capacity", "message": "old"})
    world.cluster.core.patch_node("gpu-big", {"metadata": {"annotations": {UNDONE_ANNOTATION: old}}})
    world.cluster.create(make_deployment("small", NS, 1, gpus=1, tolerations=TOLERATE_GPU))
    world.settle()
    assert set(world.bound().values()) == {"gpu-big"}
    world.rounds(1)
    [waiting] = [p for p in world.proposals() if p["target"] == "Node/gpu-big"]
    assert waiting["action"] == "replace (single-node)" and waiting["state"] == "Approved"
    assert "replaced by" in waiting["reason"] and "a replacement waits until they have not for 10m" in waiting["reason"]
    assert set(world.claims()) == {"gpu-big"}  # nothing launched while the pods are that fresh
    world.clock.advance(600)
    world.runner.run_all()  # the replacement starts: the new NodeClaim first, the node still takes pods
    new = set(world.claims()) - {"gpu-big"}
    assert len(new) == 1
    [claim] = [world.claims()[n] for n in new]
    check_against_crd(claim, "nodeclaims")
    kind = claim["spec"]["requirements"][0]["values"][0]
    assert kind != "p4de.24xlarge"
    node = world.nodes()["gpu-big"]
    assert not node["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(node)
    [started] = [p for p in world.proposals() if p["target"] == "Node/gpu-big"]
    assert started["state"] == "Applied" and f"launches {kind}" in started["reason"]
    world.rounds(6)
    assert set(world.claims()) == new and "gpu-big" not in world.nodes()
    assert set(world.bound().values()) == new  # the pod moved to the cheaper node


def test_a_replacement_whose_pod_a_pdb_protects_once_its_new_node_is_up_waits_then_is_undone(
        make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy(**{"for": "10m"}))
    world.launch("gpu-big")
    world.cluster.create(make_deployment("small", NS, 1, gpus=1, tolerations=TOLERATE_GPU))
    world.settle()
    world.clock.advance(600)
    world.runner.run_all()  # the replacement starts: its new NodeClaim is launched
    new = set(world.claims()) - {"gpu-big"}
    assert len(new) == 1
    # meanwhile a budget that allows no disruption of the pod appears: the drain must not start
    world.cluster.create(make_pdb("small-pdb", NS, match_labels={"app": "small"}, min_available=1))
    pdb_status(world, "small-pdb", 0)
    before = world.bound()
    for _ in range(6):
        world.rounds(1, advance=30)
        node = world.nodes()["gpu-big"]
        assert not node["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(node)
        assert world.bound() == before
    [waiting] = [p for p in world.proposals() if p["target"] == "Node/gpu-big"]
    assert "not draining yet: pdb ml/small-pdb prevents pod evictions" in waiting["reason"], waiting
    world.rounds(6, advance=30)  # past drainTimeout (5m): undone, the new NodeClaim (no pod) deleted
    node = world.nodes()["gpu-big"]
    assert UNDONE_ANNOTATION in annotations(node) and not node["spec"].get("unschedulable")
    assert set(world.claims()) == {"gpu-big"} and world.bound() == before
    [undone] = [p for p in world.proposals() if p["action"] == "drain undone"]
    assert "pdb ml/small-pdb prevents pod evictions" in undone["reason"], undone


def test_a_replacement_killed_between_its_record_and_its_launch_is_finished_by_the_next_leader(
        make_world: Any) -> None:
    world = make_world(checkpoint=crash_at("replacing"))
    _replacement_due(world)
    one_pass_until_the_crash(world)
    assert set(world.claims()) == {"gpu-big"}  # recorded on the node, nothing launched yet
    assert "gpu.kubeon.io/replacing" in annotations(world.nodes()["gpu-big"])
    world.restart()
    world.rounds(8)
    claims = set(world.claims())
    assert len(claims) == 1 and "gpu-big" not in claims and "gpu-big" not in world.nodes()
    assert set(world.bound().values()) == claims


def test_with_min_pod_age_a_node_is_consolidated_only_once_its_youngest_pod_is_that_old(make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy(minPodAge="1h"))
    two_nodes_one_pod_each(world)
    world.rounds(3)  # both pods were just bound (their PodScheduled time): too young to move
    assert set(world.claims()) == {"gpu-a", "gpu-b"}
    assert not [p for p in world.proposals() if p["target"].startswith("Node/")]
    world.clock.advance(3600)
    world.rounds(4)
    assert len(world.claims()) == 1 and len(set(world.bound().values())) == 1


# -- leadership, the NodePool and claims on their way out ------------------------------------------
def launches(world: World) -> list[dict[str, Any]]:
    return [p for p in world.proposals() if p["action"].startswith("launch NodeClaim")]


def test_a_standby_replica_launches_no_nodeclaim_and_the_leader_does(make_world: Any) -> None:
    """Every writer checks leadership right before its write, not only the runner before the pass: the lease
    can go to another replica while a pass is under way, and two replicas launching for the same pods would
    buy two nodes. The NodePool is in shape already, so nothing but leadership stands between the plan and
    the NodeClaim."""
    world = make_world()
    leader = {"held": True}
    world.ctx.is_leader = lambda: leader["held"]
    world.create_policy(sharing_policy("mig", "MIG"))
    world.create_policy(capacity_policy(models=["NVIDIA-A100-SXM4-80GB"]))
    world.rounds(1)  # the leader declared the NodePool; nothing is pending yet
    assert world.nodepool() is not None and world.claims() == {}
    assert world.condition("NodePool")["status"] == "True"
    gpu_pods(world, 10, "nvidia.com/mig-1g.10gb")
    world.settle()
    leader["held"] = False  # the lease went to another replica
    world.capacity.reconcile(world.ctx)  # the runner skips a standby: this is a pass that lost the lease under way
    assert world.claims() == {}, "a replica without the lease created a NodeClaim"
    leader["held"] = True
    world.runner.run_all()
    assert len(world.claims()) == 1  # the same plan, launched by the leader
    assert {p["state"] for p in launches(world)} == {"Applied"}


def test_launches_wait_while_the_nodepool_cannot_be_declared(make_world: Any) -> None:
    """A NodeClaim names its NodePool, and Karpenter launches nothing for a pool that is missing or not in
    the declared shape. While server-side apply of the pool is refused (another manager owns its GPU limit,
    which the optimizer never forces) launches are approved, not applied, and say what they wait for; once
    the pool can be declared they launch."""
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    world.create_policy(capacity_policy(models=["NVIDIA-A100-SXM4-80GB"]))
    platform = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
                "spec": {"template": {"spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                    "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}},
                    "limits": {"nvidia.com/gpu": "8"}}}
    world.cluster.custom.patch_cluster_custom_object(
        "karpenter.sh", "v1", "nodepools", "gpu", platform, field_manager="platform-team",
        _content_type="application/apply-patch+yaml")
    gpu_pods(world, 10, "nvidia.com/mig-1g.10gb")
    world.settle()
    world.runner.run_all()
    pool = world.condition("NodePool")
    assert (pool["status"], pool["reason"]) == ("False", "FieldConflict")
    assert world.claims() == {}, "a NodeClaim was launched into a NodePool the controller could not declare"
    [waiting] = launches(world)
    assert waiting["state"] == "Approved" and waiting["reason"].endswith("; waiting for NodePool gpu")
    world.cluster.custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", "gpu")
    world.runner.run_all()  # the platform team gave the pool up: declared, then launched in the same pass
    assert world.condition("NodePool")["status"] == "True"
    assert len(world.claims()) == 1 and {p["state"] for p in launches(world)} == {"Applied"}


def test_a_nodeclaim_being_deleted_is_no_capacity_for_pending_pods(make_world: Any) -> None:
    """A NodeClaim with a deletionTimestamp is on its way out (Karpenter's finalizer terminates the instance):
    its node will never take the pending pods, so they get a NodeClaim of their own instead of waiting for
    it forever."""
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    world.create_policy(capacity_policy(models=["NVIDIA-A100-SXM4-80GB"]))
    world.rounds(1)
    leaving = make_nodeclaim("gpu-leaving", "p4de.24xlarge", labels={"nvidia.com/mig.config": "all-1g.10gb"},
                             taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    leaving["metadata"]["finalizers"] = ["karpenter.sh/termination"]
    world.cluster.create(leaving)  # launching (no node yet), as the burst it was launched for left
    world.cluster.custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", "gpu-leaving")
    assert world.claims()["gpu-leaving"]["metadata"].get("deletionTimestamp")  # held by the finalizer
    gpu_pods(world, 3, "nvidia.com/mig-1g.10gb")
    world.runner.run_all()  # no settle: Karpenter has not finished terminating it
    new = set(world.claims()) - {"gpu-leaving"}
    assert len(new) == 1, "pending pods were left waiting on a NodeClaim that is being deleted"
    [launched] = launches(world)
    assert launched["state"] == "Applied" and new.pop() in launched["action"]
    assert world.condition("Provisioned")["reason"] == "Planned"


def _replacement_due(world: World) -> None:
    """gpu-big (p4de, 8 GPUs) holding one 1-GPU pod for 10 minutes: its replacement by a cheaper node is due."""
    world.create_policy(capacity_policy(**{"for": "10m"}))
    world.launch("gpu-big")
    world.cluster.create(make_deployment("small", NS, 1, gpus=1, tolerations=TOLERATE_GPU))
    world.settle()
    world.rounds(1)
    world.clock.advance(600)


def _replacement_launched(make_world: Any) -> tuple[World, str]:
    """`_replacement_due`, then one pass: the world and the new NodeClaim's name."""
    world = make_world()
    _replacement_due(world)
    world.runner.run_all()
    [new] = set(world.claims()) - {"gpu-big"}
    return world, new


def test_a_replacement_drains_only_once_the_new_nodes_gpus_are_registered(make_world: Any) -> None:
    """A GPU node is Ready minutes before the GPU Operator's device plugin registers its GPUs. A drain
    started then found no room for the pods (the packing model counts registered GPUs), was undone and
    cooled down for an hour; the replacement waits for `nvidia.com/gpu` in the new node's allocatable."""
    world, new = _replacement_launched(make_world)
    world.settle()  # the stand-in registers its Node, Ready
    registered = dict(world.nodes()[new]["status"]["allocatable"])
    unregistered = {k: None for k in registered if k.startswith("nvidia.com/")}
    world.cluster.core.patch_node_status(new, {"status": {"allocatable": unregistered, "capacity": unregistered}})
    for _ in range(3):
        world.runner.run_all()
        world.clock.advance(10)
        big = world.nodes()["gpu-big"]
        assert not big["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(big), \
            "drained before the new node's GPUs were registered"
        assert UNDONE_ANNOTATION not in annotations(big) or "old" in annotations(big)[UNDONE_ANNOTATION]
    [waiting] = [p for p in world.proposals() if p["target"] == "Node/gpu-big"]
    assert waiting["state"] == "Applied" and "waiting for the new node(s)" in waiting["reason"]
    world.cluster.core.patch_node_status(new, {"status": {"allocatable": registered, "capacity": registered}})
    world.rounds(6)
    assert set(world.claims()) == {new} and "gpu-big" not in world.nodes()
    assert set(world.bound().values()) == {new}


def test_a_replacement_in_flight_is_finished_when_its_policy_is_deleted(make_world: Any) -> None:
    """Recorded work is carried on whatever the policies say now: with the last capacity policy deleted,
    the pass returned before looking at replacements, so the new NodeClaim kept running beside the node
    it was launched to replace, and that node was never drained."""
    world, new = _replacement_launched(make_world)
    world.cluster.custom.delete_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", "gpu-capacity")
    world.rounds(6)
    assert set(world.claims()) == {new} and "gpu-big" not in world.nodes()
    assert set(world.bound().values()) == {new}


def test_a_launch_karpenter_gives_up_on_is_tried_on_another_type_for_a_while(make_world: Any) -> None:
    """Karpenter deletes a NodeClaim at once when the cloud has no capacity of its type. The claim names one
    type and a stable name, so it came back every pass, the same type each time, and the pending pods never
    got a node. Now that type is left out of launches for three minutes (Karpenter's own unavailable-offerings
    time), and the reason says so; then it is the first choice again."""
    world = make_world()
    world.create_policy(sharing_policy("share", "TimeSlicing", replicas=4))
    world.create_policy(capacity_policy(models=["NVIDIA-L4", "NVIDIA-A10G"], max_gpus=16))
    gpu_pods(world, 2, "nvidia.com/gpu.shared")
    world.runner.run_all()
    [(first, claim)] = world.claims().items()
    cheapest = claim["spec"]["requirements"][0]["values"][0]
    world.cluster.custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", first)  # no capacity
    world.runner.run_all()
    [(second, claim)] = world.claims().items()
    other = claim["spec"]["requirements"][0]["values"][0]
    assert other != cheapest, "the same type was launched again"
    [launched] = [p for p in launches(world) if second in p["action"]]
    assert f"not {cheapest} (a launch failed" in launched["reason"], launched["reason"]
    world.cluster.custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", second)
    world.clock.advance(181)  # past the three minutes of the first type (the second is fresh)
    world.runner.run_all()
    [(_, claim)] = world.claims().items()
    assert claim["spec"]["requirements"][0]["values"][0] == cheapest
