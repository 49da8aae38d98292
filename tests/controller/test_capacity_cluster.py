"""GPU capacity end to end on the real control plane with real Karpenter (tests/cluster).

Real: etcd, kube-apiserver with the GpuPolicy CRD and Karpenter's own CRDs, kube-controller-manager
(Deployments, the disruption controller's PDB status, garbage collection), KWOK running the nodes,
the chart's second kube-scheduler calling our extender, and Karpenter v1.9.0 with its KWOK provider
selling the controller's own instance catalog (gpupolicy/capacity/data/aws-gpu-instances.csv): it
launches, registers and initializes our NodeClaims into KWOK nodes, provisions on its own for pending
pods it can serve, and terminates deleted NodeClaims through its finalizer (node drain, then the
instance). The controller's policy sync, layout and capacity reconcilers run in this process as the
chart's controller ServiceAccount, so each pass happens when a test says (its clock a wall clock a
test may move forward, and its crash checkpoints) and every write goes through the chart's RBAC.
Shims: the GPU Operator (tests/cluster/gpu_operator.py: GFD labels, device plugin, MIG manager) and
DCGM's series (tests/promharness, scraped by real Prometheus).

Cluster-scoped objects are the test's own: its GpuPolicies, NodePool and NodeClaims are named after
its namespace, and the fixture deletes them (Karpenter terminating the nodes) after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

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
from tests.cluster.cache import CaughtUpCache
from tests.cluster.cluster import Cluster, read
from tests.cluster.fixtures import start_cluster
from tests.cluster.karpenter import node_class_ref
from tests.cluster.kubeon import RELEASE, Kubeon
from tests.cluster.loops import MERGE_PATCH, read_items
from tests.cluster.objects import make_deployment, make_nodeclaim, make_pdb, make_pod
from tests.controller.conftest import ScriptedMetrics
from tests.promharness import DcgmExporter, PrometheusServer, constant, gpu_labels

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "gpupolicy" / "capacity" / "data" / "aws-gpu-instances.csv"
# The optimizer's extender and second scheduler as the chart renders them (the pods name it); the
# controller runs in this process. Karpenter sells the controller's catalog.
CLUSTER = {"kubeon": True, "kubeon_components": ("extender", "scheduler"), "karpenter": True,
           "karpenter_instances": CATALOG}
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
UTIL = "DCGM_FI_DEV_GPU_UTIL"
POOL_LABEL = "karpenter.sh/nodepool"
HOSTNAME = "kubernetes.io/hostname"
KARPENTER = ("karpenter.sh", "v1")
POLICIES = ("gpu.kubeon.io", "v1alpha1", "gpupolicies")
WAIT = 90.0  # seconds for the cluster to converge (2 shared cores)
HOLD = "kubeon-test/hold"  # a finalizer of the test's own

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def capacity_policy(name: str = "gpu-capacity", mode: str = "Automatic", *, models: list[str] | None = None,
                    max_gpus: int | None = 64, approvals: list[str] | None = None,
                    **consolidation: Any) -> dict[str, Any]:
    """A capacity policy of pool `gpu` on the cluster's KWOKNodeClass (World.create_policy scopes it)."""
    body: dict[str, Any] = {
        "nodePool": "gpu", "nodeClassRef": node_class_ref(),
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


class Clock:
    """The controller's clock: the wall clock (what the API server, Karpenter and KWOK stamp objects
    with) plus however far a test moved it forward, never back."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class World:
    """One test's view of the cluster and one controller (policy sync, layout, capacity) in this process.

    Names: the test's GpuPolicies, NodePools and NodeClaims are `<namespace>-<name>`; `claims()`,
    `nodes()` and `bound()` key them by `<name>`. A node Karpenter registers has a name of its own
    (the KWOK provider's random one) and its NodeClaim's name as `kubernetes.io/hostname`: tests name a
    node by its claim, `node_name()` gives the Node's.
    """

    def __init__(self, cluster: Cluster, namespace: str, *, checkpoint: Callable[[str], None] | None = None) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.prefix = f"{namespace}-"
        assert cluster.kubeon is not None
        # the chart's controller ServiceAccount: what the controller may do is what the chart grants
        self.api = config.new_client_from_config(str(cluster.kubeon.kubeconfig_of(cluster.api_client, RELEASE)))
        self.clock = Clock()
        self.policies: list[str] = []
        self.node_names: dict[str, str] = {}
        self.ctx = ControllerContext(
            api=self.api, namespace="kubeon-gpu", default_mode=Mode.RECOMMEND, prometheus_url=None, metrics=None,
            clock=self.clock, recorder=Recorder(self.api, ControllerMetrics(), self.clock, "test"),
            policies=PolicyStore(), is_leader=lambda: True)
        # Sharing policies need a metrics source to leave Recommend; the layout reads none, and the
        # scripted one has no DCGM series (no usage known: no usage-aware consolidation).
        self.ctx.metrics, self.ctx.prometheus_url = ScriptedMetrics(), "http://prometheus.test:9090"
        self.restart(checkpoint)

    def use_prometheus(self, prometheus: PrometheusServer) -> None:
        self.ctx.metrics, self.ctx.prometheus_url = from_url(prometheus.url), prometheus.url

    def restart(self, checkpoint: Callable[[str], None] | None = None) -> None:
        """A new controller process: fresh reconcilers and policy store (what survives is in the API)."""
        self.ctx.policies = PolicyStore()
        if self.ctx.cache is not None:
            self.ctx.cache.stop()
        self.ctx.cache = CaughtUpCache(self.api, self.cluster.api_client).start()  # the passes run back to back
        # 30 s steps: a hole is > 90 s, so the few seconds between the backfilled history and the first
        # live scrape (longer on a loaded machine) never read as missing data.
        self.capacity = CapacityReconciler(step_seconds=30.0, checkpoint=checkpoint)
        self.runner = ReconcileRunner(self.ctx, [PolicySync(), LayoutReconciler(timeout_seconds=300),
                                                 self.capacity])

    # -- running the controller
    def rounds(self, n: int = 4, advance: float = 10.0) -> None:
        """`n` controller passes, its clock moved `advance` seconds after each."""
        for _ in range(n):
            self.runner.run_all()
            self.clock.advance(advance)

    def until(self, predicate: Callable[[], Any], message: str, timeout: float = WAIT, advance: float = 0.0) -> Any:
        """Controller passes (its clock moved `advance` s after each) until `predicate` holds, the cluster
        (Karpenter, the schedulers, KWOK, the GPU Operator) acting meanwhile."""
        def step() -> Any:
            self.runner.run_all()
            found = predicate()
            if not found:
                self.clock.advance(advance)
                time.sleep(0.3)
            return found
        return self.cluster.wait_for(step, timeout, message)

    def wait(self, predicate: Callable[[], Any], message: str, timeout: float = WAIT) -> Any:
        """Wait for the cluster alone (no controller pass)."""
        return self.cluster.wait_for(predicate, timeout, message)

    # -- names
    def scoped(self, name: str) -> str:
        return self.prefix + name

    def short(self, name: str) -> str:
        return name.removeprefix(self.prefix)

    def node_name(self, claim: str) -> str:
        """The Node registered for the test's NodeClaim `claim` (seen once, remembered after it goes)."""
        if claim not in self.node_names:
            self.nodes()
        return self.node_names[claim]

    def target(self, claim: str) -> str:
        return f"Node/{self.node_name(claim)}"

    # -- reading
    def claims(self) -> dict[str, dict[str, Any]]:
        items = read_items(self.cluster.custom.list_cluster_custom_object(*KARPENTER, "nodeclaims",
                                                                          _preload_content=False))
        return {self.short(c["metadata"]["name"]): c for c in items
                if str((c["metadata"].get("labels") or {}).get(POOL_LABEL, "")).startswith(self.prefix)}

    def nodepool(self, name: str = "gpu") -> dict[str, Any] | None:
        try:
            return read(self.cluster.custom.get_cluster_custom_object(*KARPENTER, "nodepools", self.scoped(name),
                                                                     _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def all_nodes(self) -> list[dict[str, Any]]:
        return read_items(self.cluster.core.list_node(_preload_content=False))

    def nodes(self) -> dict[str, dict[str, Any]]:
        """The test's pool nodes by their NodeClaim's name."""
        out = {}
        for node in self.all_nodes():
            labels = node["metadata"].get("labels") or {}
            if str(labels.get(POOL_LABEL, "")).startswith(self.prefix):
                claim = self.short(labels[HOSTNAME])
                self.node_names[claim] = node["metadata"]["name"]
                out[claim] = node
        return out

    def bound(self) -> dict[str, str | None]:
        """Pod name -> the NodeClaim (short name) of its node, None while pending."""
        hosts = {n["metadata"]["name"]: self.short((n["metadata"].get("labels") or {}).get(HOSTNAME, ""))
                 for n in self.all_nodes()}
        return {p["metadata"]["name"]: hosts.get(p["spec"].get("nodeName") or "") for p in self.cluster.pods(self.ns)}

    def status(self, name: str = "gpu-capacity") -> dict[str, Any]:
        obj = self.cluster.custom.get_cluster_custom_object(*POLICIES, self.scoped(name))
        return dict(obj.get("status") or {})

    def proposals(self, name: str = "gpu-capacity") -> list[dict[str, Any]]:
        return list(self.status(name).get("proposals") or [])

    def condition(self, kind: str, name: str = "gpu-capacity") -> dict[str, Any]:
        return next(c for c in self.status(name)["conditions"] if c["type"] == kind)

    def launches(self, name: str = "gpu-capacity") -> list[dict[str, Any]]:
        return [p for p in self.proposals(name) if p["action"].startswith("launch NodeClaim")]

    # -- writing
    def create_policy(self, obj: dict[str, Any]) -> None:
        """Create a policy of this test: named `<namespace>-<name>`, selecting only its namespace, its pool
        (and approvals naming it) `<namespace>-<pool>`."""
        body = json.loads(json.dumps(obj))
        body["metadata"]["name"] = self.scoped(body["metadata"]["name"])
        spec = body["spec"]
        spec.setdefault("selector", {"namespaces": [self.ns]})
        if "capacity" in spec:
            spec["capacity"]["nodePool"] = self.scoped(spec["capacity"]["nodePool"])
        spec["approvals"] = [f"NodePool/{self.scoped(a.split('/', 1)[1])}" if a.startswith("NodePool/") else a
                             for a in spec.get("approvals") or []] or None
        if spec["approvals"] is None:
            del spec["approvals"]
        self.cluster.custom.create_cluster_custom_object(*POLICIES, body)
        self.policies.append(body["metadata"]["name"])

    def delete_policy(self, name: str) -> None:
        self.cluster.custom.delete_cluster_custom_object(*POLICIES, self.scoped(name))

    def launch(self, name: str, instance_type: str = "p4de.24xlarge", *, labels: dict[str, str] | None = None,
               wait: bool = True) -> dict[str, Any]:
        """A GPU node of the pool that Karpenter launched earlier: a NodeClaim, which real Karpenter launches
        and registers; with `wait`, until its node is Ready with its GPUs registered (the device plugin)."""
        claim = make_nodeclaim(self.scoped(name), instance_type, nodepool=self.scoped("gpu"), labels=labels,
                               taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
        claim["spec"]["nodeClassRef"] = node_class_ref()
        created = self.cluster.create(claim)
        if wait:
            self.wait_up(name)
        return created

    def up(self, claim: str) -> bool:
        """The claim's node is Ready, Karpenter-initialized, GFD-labelled and its GPUs registered."""
        node = self.nodes().get(claim)
        if node is None or node["metadata"].get("deletionTimestamp"):
            return False
        labels = node["metadata"].get("labels") or {}
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or [])
        gpus = any(k.startswith("nvidia.com/") and v not in ("0", 0) for k, v in
                   (node["status"].get("allocatable") or {}).items())
        return ready and gpus and labels.get("karpenter.sh/initialized") == "true" and \
            labels.get("nvidia.com/gpu.present") == "true" and not node["spec"].get("unschedulable")

    def wait_up(self, *claims: str) -> None:
        self.wait(lambda: all(self.up(c) for c in claims), f"nodes of {claims} up")

    def patch_node(self, claim: str, body: dict[str, Any]) -> None:
        self.cluster.core.patch_node(self.node_name(claim), body)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.cluster.create(obj)

    def deploy(self, name: str, gpus: int = 1, **kw: Any) -> None:
        """A 1-replica GPU Deployment in the test's namespace, waited for until its pod is bound."""
        self.create(make_deployment(name, self.ns, 1, gpus=gpus, tolerations=TOLERATE_GPU, **kw))
        try:
            self.wait(lambda: any(pod.startswith(f"{name}-") and node for pod, node in self.bound().items()),
                      f"the pod of {name} bound")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.explain()}") from None

    def explain(self) -> str:
        """Why pods wait, as the cluster says it: each pod's PodScheduled condition, each pool node's cordon
        and taints (a timeout's message, so that a failure in CI names its cause)."""
        pods = [(p["metadata"]["name"], p["spec"].get("nodeName"),
                 [(c.get("status"), c.get("reason"), c.get("message")) for c in p["status"].get("conditions") or []
                  if c["type"] == "PodScheduled"]) for p in self.cluster.pods(self.ns)]
        nodes = {claim: (n["spec"].get("unschedulable"), [t["key"] for t in n["spec"].get("taints") or []])
                 for claim, n in self.nodes().items()}
        return f"pods: {pods}\nnodes (cordoned, taints): {nodes}"

    def pending(self, count: int) -> None:
        """Wait until `count` pods of the namespace are marked Unschedulable by a scheduler."""
        def unschedulable() -> bool:
            pods = self.cluster.pods(self.ns, bound=False)
            return len([p for p in pods if any(c.get("reason") == "Unschedulable"
                                               for c in p["status"].get("conditions") or [])]) >= count
        self.wait(unschedulable, f"{count} pods pending")

    def pdb_computed(self, name: str, allowed: int) -> None:
        """Wait for the disruption controller's status of PDB `name`: observed, `allowed` disruptions."""
        def computed() -> bool:
            pdb = read(self.cluster.policy.read_namespaced_pod_disruption_budget(name, self.ns,
                                                                                 _preload_content=False))
            status = pdb.get("status") or {}
            return status.get("observedGeneration") == pdb["metadata"]["generation"] and \
                status.get("disruptionsAllowed") == allowed
        self.wait(computed, f"PDB {name} computed with {allowed} disruption(s) allowed")

    # -- after the test
    def clean_up(self) -> None:
        """Delete what the test made outside its namespace, the NodeClaims (Karpenter drains and terminates
        their nodes) once the namespace's workloads and budgets are gone."""
        if self.ctx.cache is not None:
            self.ctx.cache.stop()
        custom, core = self.cluster.custom, self.cluster.core
        for name in self.policies:
            try:
                custom.delete_cluster_custom_object(*POLICIES, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        client.AppsV1Api(self.cluster.api_client).delete_collection_namespaced_deployment(self.ns)
        self.cluster.policy.delete_collection_namespaced_pod_disruption_budget(self.ns)
        core.delete_collection_namespaced_pod(self.ns, grace_period_seconds=0)
        claims = list(self.claims().values())
        unregistered = {c["status"]["providerID"] for c in claims if (c.get("status") or {}).get("providerID")
                        and not any(x["type"] == "Registered" and x["status"] == "True"
                                    for x in c["status"].get("conditions") or [])}
        for claim in claims:
            name, finalizers = claim["metadata"]["name"], claim["metadata"].get("finalizers") or []
            if HOLD in finalizers:  # the test's own, keeping a claim on its way out
                custom.patch_cluster_custom_object(*KARPENTER, "nodeclaims", name, {
                    "metadata": {"finalizers": [f for f in finalizers if f != HOLD]}}, _content_type=MERGE_PATCH)
            try:
                custom.delete_cluster_custom_object(*KARPENTER, "nodeclaims", name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        pools = read_items(custom.list_cluster_custom_object(*KARPENTER, "nodepools", _preload_content=False))
        for pool in pools:
            if pool["metadata"]["name"].startswith(self.prefix):
                custom.delete_cluster_custom_object(*KARPENTER, "nodepools", pool["metadata"]["name"])
        self.wait(lambda: not self.claims(), "the test's NodeClaims gone", 120)
        self._end_leftover_instances(unregistered)
        self.api.close()

    def _end_leftover_instances(self, unregistered: set[str], patience: float = 20.0) -> None:
        """A claim deleted before its node registered: Karpenter terminates the "instance" through the KWOK
        provider, which only deletes the NodeClaim; the node its launch scheduled still comes, a registration
        delay later (a cloud would have ended the instance). Delete such nodes as they come, as the cloud
        would, until none of the test's is left and each unregistered launch's node came (or `patience` ran
        out: one registered meanwhile is Karpenter's to terminate, and it did)."""
        seen: set[str] = set()
        deadline = time.monotonic() + patience

        def ended() -> bool:
            for node in self.nodes().values():
                seen.add(node["spec"].get("providerID", ""))
                try:
                    self.cluster.core.delete_node(node["metadata"]["name"])
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            return not self.nodes() and (unregistered <= seen or time.monotonic() > deadline)
        self.wait(ended, "the test's nodes gone", 120)
        self.api.close()


@pytest.fixture(scope="module")
def time_slicing_config(kube_cluster: Cluster) -> None:
    """The device plugin's time-slicing ConfigMap, as the GPU Operator's ClusterPolicy names it."""
    try:
        kube_cluster.core.create_namespaced_config_map("gpu-operator", {
            "metadata": {"name": "time-slicing-config"}, "data": {}})
    except ApiException as exc:
        if exc.status != 409:
            raise


@pytest.fixture
def make_world(kube_cluster: Cluster, namespace: str, time_slicing_config: None) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(**kw: Any) -> World:
        world = World(kube_cluster, namespace, **kw)
        made.append(world)
        return world

    yield make
    for world in made:
        world.clean_up()


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def gpu_pods(world: World, count: int, resource: str, prefix: str = "p") -> None:
    for i in range(count):
        world.create(make_pod(f"{prefix}{i}", world.ns, gpus=1, gpu_resource=resource, tolerations=TOLERATE_GPU))


# -- provisioning --------------------------------------------------------------------------
def launched(claim: dict[str, Any]) -> bool:
    return any(c["type"] == "Launched" and c["status"] == "True" for c in claim["status"].get("conditions") or [])


def test_pending_time_sliced_burst_gets_a_nodepool_and_nodeclaims_once(make_world: Any) -> None:
    """The controller declares the NodePool and launches NodeClaims for pods on shared GPUs, which Karpenter
    cannot serve itself (no instance type offers `nvidia.com/gpu.shared`); real Karpenter launches them,
    the pods run on their nodes, and nothing more is launched by either."""
    world = make_world()
    world.create_policy(sharing_policy("share", "TimeSlicing", replicas=4))
    world.create_policy(capacity_policy(models=["NVIDIA-L4"], max_gpus=16))
    gpu_pods(world, 50, "nvidia.com/gpu.shared")
    world.pending(50)
    world.runner.run_all()
    pool = world.nodepool()
    assert pool is not None
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "16"}
    template = pool["spec"]["template"]["spec"]
    assert template["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert template["requirements"][0] == {"key": "node.kubernetes.io/instance-type", "operator": "In",
                                           "values": ["g6.xlarge"]}
    assert template["nodeClassRef"] == node_class_ref()
    assert pool["spec"]["disruption"]["budgets"] == [{"nodes": "1"}]
    # the spec is ours alone, by server-side apply (Karpenter writes the pool's status, never its spec)
    spec_owners = {(m["manager"], m["operation"]) for m in pool["metadata"]["managedFields"]
                   if "f:spec" in m.get("fieldsV1", {})}
    assert spec_owners == {("kubeon-gpu-optimizer", "Apply")}, pool["metadata"]["managedFields"]
    claims = world.claims()
    assert len(claims) == 13  # 50 shares at 4 per L4 GPU, one L4 per g6.xlarge
    for claim in claims.values():
        assert claim["metadata"]["labels"]["karpenter.sh/nodepool"] == world.scoped("gpu")
    launches = world.launches()  # shown while the claims launch (real Karpenter registers them in seconds)
    assert len(launches) == 13 and {p["state"] for p in launches} == {"Applied"}
    world.runner.run_all()  # the next pass counts the launching claims: no second set
    world.runner.run_all()
    assert set(world.claims()) == set(claims)
    # Karpenter validated the pool (its Ready condition) and launched every claim
    world.wait(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                           for c in (world.nodepool() or {}).get("status", {}).get("conditions") or []),
               "NodePool Ready (validated by Karpenter)")
    world.until(lambda: len(world.cluster.pods(world.ns, ready=True)) == 50, "the 50 pods running", 180)
    assert set(world.claims()) == set(claims)  # nodes registered, pods bound: nothing more launched
    # each launched by Karpenter as an L4 instance (`nvidia.com/gpu` 1), its node shared 4 ways by the device plugin
    assert all(launched(c) and c["status"]["allocatable"]["nvidia.com/gpu"] == "1" for c in world.claims().values())
    assert set(world.bound().values()) <= set(claims)
    for node in world.nodes().values():
        assert node["status"]["allocatable"]["nvidia.com/gpu.shared"] == "4"


def test_max_gpus_caps_the_launches_and_says_so(make_world: Any) -> None:
    world = make_world()
    world.create_policy(sharing_policy("share", "TimeSlicing", replicas=4))
    world.create_policy(capacity_policy(models=["NVIDIA-L4"], max_gpus=3))
    gpu_pods(world, 20, "nvidia.com/gpu.shared")
    world.pending(20)
    world.rounds(2)
    assert len(world.claims()) == 3
    unserved = world.condition("Provisioned")
    assert (unserved["status"], unserved["reason"]) == ("False", "Unserved")
    assert "8 pending pod(s) get no node (maxGpus 3 reached)" in unserved["message"]


def test_a_pod_no_node_type_has_the_cpu_for_is_reported_unserved_after_one_launch(make_world: Any) -> None:
    """A node offers its allocatable, not its capacity: Karpenter's KWOK provider keeps 100m of a g6.xlarge's
    4 CPUs. The first launch for a 4-CPU shared-GPU pod goes by the catalog's capacity (no node of the type
    seen yet); once real Karpenter has launched it (the NodeClaim's status.allocatable), the controller knows
    no L4 node holds the pod, says so, and launches nothing more. (Before, the node's four free shares
    counted the pod as served: "no pending shared-GPU pod lacks a node", while it stayed pending.)"""
    world = make_world()
    world.create_policy(sharing_policy("share", "TimeSlicing", replicas=4))
    world.create_policy(capacity_policy(models=["NVIDIA-L4"], max_gpus=8))
    world.create(make_pod("whole-cpu", world.ns, gpus=1, cpu="4", gpu_resource="nvidia.com/gpu.shared",
                          tolerations=TOLERATE_GPU))
    world.pending(1)
    world.runner.run_all()
    [(name, _)] = world.claims().items()
    claim = world.until(lambda: (c := world.claims().get(name)) and launched(c) and c, "the NodeClaim launched")
    assert claim["status"]["allocatable"]["cpu"] == "3900m"  # what Karpenter says the node will offer
    world.until(lambda: name in world.nodes(), "its node registered")
    world.rounds(4)
    assert list(world.claims()) == [name]  # no second node for a pod no L4 node holds
    unserved = world.condition("Provisioned")
    assert (unserved["status"], unserved["reason"]) == ("False", "Unserved"), unserved
    assert "1 pending pod(s) get no node (no allowed instance type holds them)" in unserved["message"]
    assert world.cluster.pods(world.ns, ready=True) == []


def test_pending_mig_pods_get_a_nodeclaim_sized_and_labelled_for_them(make_world: Any) -> None:
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    world.create_policy(capacity_policy(models=["NVIDIA-A100-SXM4-80GB"]))
    gpu_pods(world, 10, "nvidia.com/mig-1g.10gb")
    world.pending(10)
    world.runner.run_all()
    [(name, claim)] = world.claims().items()
    requirement = claim["spec"]["requirements"][0]
    assert requirement["values"] == ["p4de.24xlarge"]  # 10 x 1/7 GPU: one 8-GPU A100-80GB node
    assert claim["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.10gb"
    world.until(lambda: len(world.cluster.pods(world.ns, ready=True)) == 10, "the 10 pods running")
    node = world.nodes()[name]
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "56"
    assert set(world.bound().values()) == {name}
    assert list(world.claims()) == [name]


def test_a_pending_whole_gpu_pod_is_karpenters_own_in_the_declared_nodepool(make_world: Any) -> None:
    """Whole-GPU pods are Karpenter's to provision: the controller declares the NodePool and launches
    nothing for them; real Karpenter launches a NodeClaim in that pool, of an instance type the policy
    allows, whose KWOK node registers with `nvidia.com/gpu` allocatable, and the pod runs there."""
    world = make_world()
    world.create_policy(capacity_policy(models=["NVIDIA-L4", "NVIDIA-A10G"], max_gpus=4))
    world.rounds(1)  # the NodePool, before any pod is pending
    assert world.condition("NodePool")["status"] == "True"
    world.create(make_pod("train", world.ns, gpus=1, tolerations=TOLERATE_GPU))
    world.until(lambda: world.cluster.pods(world.ns, ready=True), "the pod running")
    [(name, claim)] = world.claims().items()
    assert claim["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "g6.xlarge"  # the cheapest allowed
    assert not claim["metadata"]["labels"].get("app.kubernetes.io/managed-by"), "Karpenter's, not ours"
    node = world.nodes()[name]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert world.bound() == {"train": name}
    assert world.launches() == []
    provisioned = world.condition("Provisioned")
    assert provisioned["status"] == "True", provisioned


def test_with_whole_gpus_by_the_optimizer_four_pods_get_four_cheap_nodes_and_karpenter_launches_none(
        make_world: Any) -> None:
    """`wholeGpus: Optimizer`: the NodePool's GPU limit is 0, so real Karpenter launches nothing itself, and
    the controller launches for whole-GPU pods too, choosing by price: four 1-GPU pods get four g5.xlarge
    ($1.006/h each, $4.02/h), not the one g5.12xlarge ($5.67/h) that holds all four, which real Karpenter
    buys for the same four pods (next test)."""
    world = make_world()
    policy = capacity_policy(models=["NVIDIA-A10G"], max_gpus=8)
    policy["spec"]["capacity"]["wholeGpus"] = "Optimizer"
    world.create_policy(policy)
    world.rounds(1)
    assert world.nodepool()["spec"]["limits"] == {"nvidia.com/gpu": "0"}
    assert "wholeGpus Optimizer" in world.condition("NodePool")["message"]
    gpu_pods(world, 4, "nvidia.com/gpu")
    world.pending(4)
    world.runner.run_all()
    claims = world.claims()
    assert sorted(c["spec"]["requirements"][0]["values"][0] for c in claims.values()) == ["g5.xlarge"] * 4
    assert all(c["metadata"]["labels"].get("app.kubernetes.io/managed-by") for c in claims.values()), "ours"
    world.until(lambda: len(world.cluster.pods(world.ns, ready=True)) == 4, "the 4 pods running")
    world.runner.run_all()
    assert set(world.claims()) == set(claims)  # Karpenter launched none, and no second set of ours
    assert set(world.bound().values()) == set(claims)


def test_with_whole_gpus_by_karpenter_the_same_four_pods_get_one_dearer_node(make_world: Any) -> None:
    """The default, `wholeGpus: Karpenter`: real Karpenter packs the batch onto one NodeClaim, whose only
    type that holds four A10G pods is g5.12xlarge ($5.67/h against four g5.xlarge at $4.02/h)."""
    world = make_world()
    world.create_policy(capacity_policy(models=["NVIDIA-A10G"], max_gpus=8))
    world.rounds(1)
    assert world.nodepool()["spec"]["limits"] == {"nvidia.com/gpu": "8"}
    gpu_pods(world, 4, "nvidia.com/gpu")
    world.until(lambda: len(world.cluster.pods(world.ns, ready=True)) == 4, "the 4 pods running")
    assert [c["metadata"]["labels"]["node.kubernetes.io/instance-type"]
            for c in world.claims().values()] == ["g5.12xlarge"]


# -- consolidation ---------------------------------------------------------------------------
def two_nodes_one_pod_each(world: World, **pod_kw: Any) -> None:
    """gpu-a and gpu-b (8 GPUs each), one 1-GPU Deployment pod on each (the other node cordoned meanwhile)."""
    world.launch("gpu-a", wait=False)
    world.launch("gpu-b")
    world.wait_up("gpu-a")
    for name, other in (("job-a", "gpu-b"), ("job-b", "gpu-a")):
        world.patch_node(other, {"spec": {"unschedulable": True}})
        world.deploy(name, **pod_kw)
        world.patch_node(other, {"spec": {"unschedulable": None}})
    assert sorted(world.bound().values()) == ["gpu-a", "gpu-b"]


def test_an_idle_gpu_node_whose_pods_fit_elsewhere_is_drained_and_its_nodeclaim_deleted(
        make_world: Any, dcgm_exporter: DcgmExporter, prometheus_factory: Callable[..., PrometheusServer]) -> None:
    world = make_world()
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    for pod, claim in world.bound().items():  # DCGM's series name the node the pod runs on
        assert claim is not None
        util = 3 if claim == "gpu-a" else 60
        dcgm_exporter.put(UTIL, gpu_labels(namespace=world.ns, pod=pod, host=world.node_name(claim)), constant(util))
    world.use_prometheus(prometheus_factory(history=900, step=5))
    world.runner.run_all()
    drained = [p for p in world.proposals() if p["target"] == world.target("gpu-a")]
    assert drained, world.proposals()
    a, b = world.node_name("gpu-a"), world.node_name("gpu-b")
    assert f"{a}: 1 pod, GPU util 3% for 10min; it fits on {b}" in json.dumps(drained)
    world.until(lambda: "gpu-a" not in world.claims() and "gpu-a" not in world.nodes()
                and set(world.bound().values()) == {"gpu-b"}, "gpu-a drained and its NodeClaim terminated")
    assert "gpu-b" in world.claims() and not world.nodes()["gpu-b"]["spec"].get("unschedulable")


def budgets_at_the_cordon(world_box: dict[str, World]) -> Callable[[str], None]:
    """A checkpoint that, at the first cordon, creates a PodDisruptionBudget (minAvailable 1) over each of
    job-a and job-b and waits for the disruption controller's status: a budget applied while the drain runs,
    between its start (the pass saw none) and its evictions, which the Eviction API then refuses (429)."""
    def hook(step: str) -> None:
        world = world_box["world"]
        if step != "cordoned" or world_box.get("done"):
            return
        world_box["done"] = world
        for name in ("job-a", "job-b"):
            world.create(make_pdb(f"{name}-pdb", world.ns, match_labels={"app": name}, min_available=1))
        for name in ("job-a", "job-b"):
            world.pdb_computed(f"{name}-pdb", 0)
    return hook


def world_with_budgets_at_the_cordon(make_world: Any) -> World:
    box: dict[str, World] = {}
    world: World = make_world(checkpoint=budgets_at_the_cordon(box))
    box["world"] = world
    return world


def test_a_pdb_applied_mid_drain_refuses_the_evictions_the_drain_is_held_then_undone_and_reported(
        make_world: Any) -> None:
    """The pass that starts a drain saw no budget against it; one applied between the cordon and the
    evictions makes the Eviction API answer 429. The drain keeps the node cordoned and retries within
    drainTimeout, then undoes itself and says why (a Warning Event on the node)."""
    world = world_with_budgets_at_the_cordon(make_world)
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
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
    assert [p["target"] for p in undone] == [world.target(victim)]
    assert "not finished within 300s" in undone[0]["reason"] and "Cannot evict pod" in undone[0]["reason"]
    warnings = [e for e in world.cluster.events(world.ctx.recorder.namespace, "CapacityDrainUndone")
                if e["involvedObject"]["name"] == world.node_name(victim)]
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
    world.launch("gpu-a", wait=False)
    world.launch("gpu-b")
    world.wait_up("gpu-a")
    # guarded and free on gpu-a, big (which stays: do-not-disrupt) on gpu-b; the other node cordoned meanwhile
    for name, gpus, other, notes in (("guarded", 1, "gpu-b", None), ("free", 1, "gpu-b", None),
                                     ("big", 4, "gpu-a", {"karpenter.sh/do-not-disrupt": "true"})):
        world.patch_node(other, {"spec": {"unschedulable": True}})
        world.deploy(name, gpus, pod_annotations=notes)
        world.patch_node(other, {"spec": {"unschedulable": None}})
    before = world.bound()
    assert sorted(before.values()) == ["gpu-a", "gpu-a", "gpu-b"]
    world.create(make_pdb("guarded-pdb", world.ns, match_labels={"app": "guarded"}, min_available=1))
    world.pdb_computed("guarded-pdb", 0)  # one pod, minAvailable 1
    for _ in range(12):  # past drainTimeout (5m): nothing started, so nothing to undo
        world.rounds(1, advance=30)
        node = world.nodes()["gpu-a"]
        assert not node["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(node)
        assert UNDONE_ANNOTATION not in annotations(node)
        assert world.bound() == before  # no pod evicted (a Deployment's new pod has a new name)
    held = [p for p in world.proposals() if p["target"] == world.target("gpu-a")]
    assert held and all(p["state"] != "Applied" for p in held), held
    assert f"not a candidate this pass: pdb {world.ns}/guarded-pdb prevents pod evictions" in held[0]["reason"], held
    assert set(world.claims()) == {"gpu-a", "gpu-b"}
    # the budget changes and the disruption controller says one disruption is allowed: gpu-a is consolidated
    world.cluster.policy.patch_namespaced_pod_disruption_budget(
        "guarded-pdb", world.ns, {"spec": {"minAvailable": 0}}, _preload_content=False)
    world.pdb_computed("guarded-pdb", 1)
    world.until(lambda: "gpu-a" not in world.claims() and "gpu-a" not in world.nodes()
                and set(world.bound().values()) == {"gpu-b"}, "gpu-a consolidated")


def test_a_do_not_disrupt_pod_keeps_its_node(make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world, pod_annotations={"karpenter.sh/do-not-disrupt": "true"})
    world.rounds(4)
    assert set(world.claims()) == {"gpu-a", "gpu-b"}
    assert all(not n["spec"].get("unschedulable") for n in world.nodes().values())
    assert not [p for p in world.proposals() if p["target"].startswith("Node/")]


def test_pods_that_would_not_fit_elsewhere_keep_the_node(make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy())
    world.launch("gpu-a", wait=False)
    world.launch("gpu-b")
    world.wait_up("gpu-a")
    for name in ("big-a", "big-b"):
        world.create(make_deployment(name, world.ns, 1, gpus=5, tolerations=TOLERATE_GPU))
    world.wait(lambda: len([n for n in world.bound().values() if n]) == 2, "both pods bound")
    world.rounds(4)
    assert sorted(world.bound().values()) == ["gpu-a", "gpu-b"]
    assert set(world.claims()) == {"gpu-a", "gpu-b"}
    assert not [p for p in world.proposals() if p["target"].startswith("Node/")]


def make_job(name: str, namespace: str, **spec_args: Any) -> dict[str, Any]:
    """A batch/v1 Job of one pod (KWOK runs it to Succeeded, its container's finishedAt stamped)."""
    pod = make_pod(name, namespace, **spec_args)
    pod["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}}}


def kept_node_and_gpu_a(make_world: Any) -> World:
    """Two pool nodes with emptyFor 1m: gpu-b kept by a Deployment's pod (8 GPUs)."""
    world = make_world()
    world.create_policy(capacity_policy(emptyFor="1m"))
    world.launch("gpu-a", wait=False)
    world.launch("gpu-b")
    world.wait_up("gpu-a")
    world.deploy("keep", 8, node_selector={HOSTNAME: world.scoped("gpu-b")})
    return world


def test_a_node_whose_gpu_pods_finished_is_removed_within_one_loop_after_the_grace(make_world: Any) -> None:
    world = kept_node_and_gpu_a(make_world)
    world.create(make_job("train", world.ns, gpus=8, tolerations=TOLERATE_GPU,
                          node_selector={HOSTNAME: world.scoped("gpu-a")}))
    world.wait(lambda: [p for p in world.cluster.pods(world.ns, "app=train")
                        if p["status"].get("phase") == "Succeeded" and p["spec"].get("nodeName")
                        == world.node_name("gpu-a")], "the Job's pod finished on gpu-a")
    world.runner.run_all()
    assert "gpu-a" in world.claims()  # within the grace
    world.clock.advance(60)
    world.runner.run_all()  # one loop after the grace: the claim is deleted
    claim = world.claims().get("gpu-a")
    assert claim is None or claim["metadata"].get("deletionTimestamp")
    world.wait(lambda: "gpu-a" not in world.nodes() and "gpu-a" not in world.claims(), "gpu-a terminated")
    assert "gpu-b" in world.nodes()


def test_a_node_emptied_by_deleting_its_pods_also_gets_the_grace(make_world: Any) -> None:
    world = kept_node_and_gpu_a(make_world)
    world.create(make_pod("job", world.ns, gpus=8, tolerations=TOLERATE_GPU,
                          node_selector={HOSTNAME: world.scoped("gpu-a")}))
    world.wait(lambda: world.bound().get("job") == "gpu-a", "job bound on gpu-a")
    world.clock.advance(600)  # the node is old: its creation says nothing about when it emptied
    world.runner.run_all()
    world.cluster.core.delete_namespaced_pod("job", world.ns)
    world.wait(lambda: "job" not in world.bound(), "job deleted")
    world.runner.run_all()
    world.clock.advance(30)
    world.runner.run_all()
    assert "gpu-a" in world.claims() and not world.claims()["gpu-a"]["metadata"].get("deletionTimestamp")
    world.clock.advance(31)
    world.runner.run_all()
    world.wait(lambda: "gpu-a" not in world.claims() and "gpu-b" in world.claims(), "gpu-a terminated")


def test_recommend_writes_nothing(make_world: Any) -> None:
    world = make_world()
    world.launch("gpu-a")  # a node of the pool from before; Recommend never declares the NodePool
    world.create_policy(sharing_policy("mig", "MIG", gpuModels=["NVIDIA-H100-80GB-HBM3"]))
    world.create_policy(capacity_policy(mode="Recommend", models=["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]))
    gpu_pods(world, 3, "nvidia.com/mig-1g.10gb")
    world.pending(3)
    world.rounds(1)
    before_nodes = {n: (v["metadata"].get("annotations"), v["spec"].get("unschedulable"))
                    for n, v in world.nodes().items()}
    world.rounds(3, advance=120)
    assert world.nodepool() is None
    assert set(world.claims()) == {"gpu-a"}
    assert {n: (v["metadata"].get("annotations"), v["spec"].get("unschedulable"))
            for n, v in world.nodes().items()} == before_nodes
    actions = {(p["target"], p["action"].split(" (")[0].split(" NodeClaim")[0], p["state"]) for p in world.proposals()}
    pool = world.scoped("gpu")
    assert (f"NodePool/{pool}", f"declare NodePool {pool}", "Proposed") in actions
    assert (f"NodePool/{pool}", "launch", "Proposed") in actions
    assert (world.target("gpu-a"), "delete", "Proposed") in actions  # empty for longer than emptyFor


def test_approve_applies_only_the_approved_targets(make_world: Any) -> None:
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    world.create_policy(capacity_policy(mode="Approve", approvals=["NodePool/gpu"],
                                        models=["NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"]))
    world.launch("gpu-idle", "g6.xlarge")  # an L4: no MIG, so the layout cannot use it for the pods
    gpu_pods(world, 2, "nvidia.com/mig-3g.40gb")
    world.pending(2)
    world.rounds(1)
    assert world.nodepool() is not None and len(world.claims()) == 2  # the idle node and one launch
    world.rounds(2, advance=120)
    assert "gpu-idle" in world.claims()  # Node/gpu-idle is not approved: proposed only
    idle = [p for p in world.proposals() if p["target"] == world.target("gpu-idle")]
    assert idle and {p["state"] for p in idle} == {"Proposed"}


class Crash(Exception):
    """The controller dying at a checkpoint (the in-process stand-in for tests/..._crash_process.py's kill)."""


def crash_at(checkpoint: str) -> Callable[[str], None]:
    def hook(step: str) -> None:
        if step == checkpoint:
            raise Crash(step)
    return hook


def one_pass_until_the_crash(world: World) -> None:
    with pytest.raises(Crash):  # the runner would log and carry on: call the reconcilers as a process does
        world.ctx.policies.replace_all([])  # nothing carried in memory but what the API holds
        for reconciler in world.runner.reconcilers:
            reconciler.reconcile(world.ctx)


def test_killing_the_controller_mid_drain_converges(make_world: Any) -> None:
    world = make_world(checkpoint=crash_at("evicted"))
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    originals = {p["metadata"]["uid"] for p in world.cluster.pods(world.ns)}
    one_pass_until_the_crash(world)
    cordoned = [n for n, v in world.nodes().items() if v["spec"].get("unschedulable")]
    assert len(cordoned) == 1
    [victim] = cordoned
    assert DRAINING_ANNOTATION in annotations(world.nodes()[victim])
    world.restart()  # the next leader: no memory of the drain but the node's annotation

    def converged() -> bool:
        pods = world.cluster.pods(world.ns)
        return victim not in world.claims() and victim not in world.nodes() and len(pods) == 2 and \
            all(p["spec"].get("nodeName") for p in pods)
    world.until(converged, f"{victim} drained and terminated, both pods bound")
    pods = world.cluster.pods(world.ns)
    replaced = [p for p in pods if p["metadata"]["uid"] not in originals]
    assert len(replaced) == 1  # the one evicted pod was replaced once: evicted once for the plan
    assert all(not v["spec"].get("unschedulable") for v in world.nodes().values())


def test_a_pending_pod_is_provisioned_for_once_by_the_first_policy_covering_it(make_world: Any) -> None:
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    first = capacity_policy("first", models=["NVIDIA-A100-SXM4-80GB"])
    first["spec"]["priority"] = 10
    second = capacity_policy("second", models=["NVIDIA-A100-SXM4-80GB"])
    second["spec"]["capacity"]["nodePool"] = "gpu-other"
    world.create_policy(first)
    world.create_policy(second)
    gpu_pods(world, 4, "nvidia.com/mig-1g.10gb")
    world.pending(4)
    world.rounds(1)
    pools = [c["metadata"]["labels"]["karpenter.sh/nodepool"] for c in world.claims().values()]
    assert pools == [world.scoped("gpu")]
    assert not [p for p in world.proposals("second") if p["action"].startswith("launch")]


def test_a_drain_whose_pods_no_longer_fit_elsewhere_is_undone(make_world: Any) -> None:
    world = world_with_budgets_at_the_cordon(make_world)  # the drain starts, the evictions are refused
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    world.rounds(1, advance=1)
    [victim] = [n for n, node in world.nodes().items() if DRAINING_ANNOTATION in annotations(node)]
    other = ({"gpu-a", "gpu-b"} - {victim}).pop()
    world.create(make_pod("filler", world.ns, gpus=7, tolerations=TOLERATE_GPU))  # the other node is full now
    world.wait(lambda: world.bound().get("filler") == other, "filler bound on the other node")
    world.rounds(1, advance=1)
    node = world.nodes()[victim]
    assert not node["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(node)
    undone = [p for p in world.proposals() if p["action"] == "drain undone"]
    assert undone and "no longer fit on the other nodes" in undone[0]["reason"]


# -- the core's optional inputs, built from live objects -------------------------------------------
def set_evictions(world: World, records: dict[str, Any], name: str = "gpu-capacity") -> None:
    """status.evictions as earlier drains left it (the controller's own record, written through the API)."""
    world.cluster.custom.patch_cluster_custom_object_status(*POLICIES, world.scoped(name),
                                                            {"status": {"evictions": records}})


def test_evictions_are_counted_per_workload_once_across_a_crash_and_the_pods_re_creation(
        make_world: Any) -> None:
    world = make_world(checkpoint=crash_at("evicted"))
    world.create_policy(capacity_policy())
    two_nodes_one_pod_each(world)
    before = {p["metadata"]["name"] for p in world.cluster.pods(world.ns)}
    one_pass_until_the_crash(world)
    [(key, record)] = world.status().get("evictions", {}).items()
    assert record["count"] == 0 and len(record["pending"]) == 1  # asked, not yet counted: the crash
    world.restart()
    world.until(lambda: len(world.claims()) == 1 and len([n for n in world.bound().values() if n]) == 2,
                "the drained node gone, both pods bound")
    world.rounds(2)
    after = {p["metadata"]["name"] for p in world.cluster.pods(world.ns)}
    assert len(after - before) == 1  # the evicted pod came back under a new name
    records = world.status()["evictions"]
    assert list(records) == [key] and key in (f"Deployment/{world.ns}/job-a", f"Deployment/{world.ns}/job-b")
    assert records[key]["count"] == 1 and records[key]["pending"] == [] and len(records[key]["evicted"]) == 1


def test_a_workload_evicted_max_evictions_per_pod_times_pins_its_node(make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy())
    world.rounds(1)
    world.launch("gpu-a", wait=False)
    world.launch("gpu-b")
    world.wait_up("gpu-a")
    # of two equal candidates the first by node name goes: pin the workload on that one
    first, second = sorted(("gpu-a", "gpu-b"), key=world.node_name)
    pinned, moved = ("job-a", "job-b") if first == "gpu-a" else ("job-b", "job-a")
    set_evictions(world, {f"Deployment/{world.ns}/{pinned}": {"count": 3, "at": world.clock.now()}})
    for name, other in (("job-a", "gpu-b"), ("job-b", "gpu-a")):
        world.patch_node(other, {"spec": {"unschedulable": True}})
        world.deploy(name)
        world.patch_node(other, {"spec": {"unschedulable": None}})
    # without the count `first` would go; pinned, `second` goes instead
    world.until(lambda: second not in world.claims() and set(world.bound().values()) == {first},
                f"{second} consolidated onto {first}")
    assert first in world.claims()
    assert world.status()["evictions"][f"Deployment/{world.ns}/{moved}"]["count"] == 1
    assert world.status()["evictions"][f"Deployment/{world.ns}/{pinned}"]["count"] == 3


# -- against Karpenter's own NodePool accounting -----------------------------------------
def test_the_controller_keeps_within_max_gpus_where_karpenters_own_count_cannot_see_shared_gpus(
        make_world: Any) -> None:
    """Karpenter checks a NodePool's limits only in its own provisioner (a NodeClaim created by anyone else
    launches whatever the limits say), and counts status.resources from each node's capacity once
    initialized: a time-sliced node advertises nvidia.com/gpu.shared, not nvidia.com/gpu. So the controller
    counts the GPUs of the pool's claims by instance type itself, and lowers the limit it writes by the GPUs
    Karpenter's count misses."""
    world = make_world()
    world.create_policy(sharing_policy("share", "TimeSlicing", replicas=4))
    world.create_policy(capacity_policy(models=["NVIDIA-L4"], max_gpus=3))
    gpu_pods(world, 20, "nvidia.com/gpu.shared")
    world.pending(20)
    world.until(lambda: len(world.cluster.pods(world.ns, ready=True)) == 12, "12 pods running on 3 L4 nodes")
    gpu_pods(world, 8, "nvidia.com/gpu.shared", prefix="late")
    world.pending(16)

    def counted() -> bool:
        pool = world.nodepool() or {}
        resources = (pool.get("status") or {}).get("resources") or {}
        return resources.get("nvidia.com/gpu.shared") == "12" and pool["spec"]["limits"] == {"nvidia.com/gpu": "0"}
    world.until(counted, "Karpenter's count of the pool's time-sliced nodes and the limit written for it")
    world.rounds(2)
    claims = world.claims()
    assert len(claims) == 3
    for claim in claims.values():
        conditions = {c["type"]: c["status"] for c in claim["status"]["conditions"]}
        assert {t: conditions.get(t) for t in ("Launched", "Registered", "Initialized", "Ready")} == dict.fromkeys(
            ("Launched", "Registered", "Initialized", "Ready"), "True"), conditions
    pool = world.nodepool()
    assert pool is not None
    resources = pool["status"]["resources"]
    assert (resources["nodes"], pool["status"]["nodes"]) == ("3", 3)
    # Karpenter's count misses the shared GPUs: it keeps the key it once counted (the node's nvidia.com/gpu
    # before the device plugin renamed it) at zero
    assert resources["nvidia.com/gpu.shared"] == "12" and resources.get("nvidia.com/gpu", "0") == "0"
    # so the limit written for Karpenter's own (whole-GPU) provisioning is maxGpus less what it cannot see
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "0"}
    [declared] = [p for p in world.proposals() if p["action"] == f"declare NodePool {world.scoped('gpu')}"]
    assert "limits nvidia.com/gpu=0 (maxGpus 3 less 3 GPU(s) on 3 time-sliced or MIG node(s)" in declared["reason"]
    # KWOK's NodeClaims carry the instance type's GPUs in status.allocatable (status.capacity is the claim's
    # resource requests, none here)
    assert sum(int(claim["status"]["allocatable"]["nvidia.com/gpu"]) for claim in claims.values()) == 3
    assert len([p for p, node in world.bound().items() if node]) == 12
    unserved = world.condition("Provisioned")
    assert (unserved["status"], unserved["reason"]) == ("False", "Unserved")
    assert "16 pending pod(s) get no node (maxGpus 3 reached)" in unserved["message"]


# -- replacement by a cheaper node ------------------------------------------------------------------
def test_a_node_whose_pods_fit_on_a_cheaper_new_node_is_replaced_launching_before_the_drain(
        make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy(**{"for": "10m"}))
    world.launch("gpu-big")  # p4de.24xlarge: 8 A100-80GB
    # the same plan undone long ago (past its cool-down): says nothing about this replacement
    plan = proposal_id(world.scoped("gpu-capacity"), world.target("gpu-big"), "replace (single-node)")
    old = json.dumps({"at": world.clock.now() - 7200, "plan": plan, "policy": world.scoped("gpu-capacity"),
                      "message": "old"})
    world.patch_node("gpu-big", {"metadata": {"annotations": {UNDONE_ANNOTATION: old}}})
    world.deploy("small")
    assert set(world.bound().values()) == {"gpu-big"}
    world.rounds(1)
    [waiting] = [p for p in world.proposals() if p["target"] == world.target("gpu-big")]
    assert waiting["action"] == "replace (single-node)" and waiting["state"] == "Approved"
    assert "replaced by" in waiting["reason"] and "a replacement waits until they have not for 10m" in waiting["reason"]
    assert set(world.claims()) == {"gpu-big"}  # nothing launched while the pods are that fresh
    world.clock.advance(600)
    world.runner.run_all()  # the replacement starts: the new NodeClaim first, the node still takes pods
    new = set(world.claims()) - {"gpu-big"}
    assert len(new) == 1
    [claim] = [world.claims()[n] for n in new]
    kind = claim["spec"]["requirements"][0]["values"][0]
    assert kind != "p4de.24xlarge"
    node = world.nodes()["gpu-big"]
    assert not node["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(node)
    [started] = [p for p in world.proposals() if p["target"] == world.target("gpu-big")]
    assert started["state"] == "Applied" and f"launches {kind}" in started["reason"]
    world.until(lambda: set(world.claims()) == new and "gpu-big" not in world.nodes()
                and set(world.bound().values()) == new, "the pod moved to the cheaper node, gpu-big terminated")
    assert launched(world.claims()[new.pop()])  # real Karpenter launched the controller's NodeClaim


def _replacement_due(world: World) -> None:
    """gpu-big (p4de, 8 GPUs) holding one 1-GPU pod for 10 minutes: its replacement by a cheaper node is due."""
    world.create_policy(capacity_policy(**{"for": "10m"}))
    world.launch("gpu-big")
    world.deploy("small")
    world.rounds(1)
    world.clock.advance(600)


def _replacement_launched(make_world: Any) -> tuple[World, str]:
    """`_replacement_due`, then one pass: the world and the new NodeClaim's name."""
    world = make_world()
    _replacement_due(world)
    world.runner.run_all()
    [new] = set(world.claims()) - {"gpu-big"}
    return world, new


def test_a_replacement_whose_pod_a_pdb_protects_once_its_new_node_is_up_waits_then_is_undone(
        make_world: Any) -> None:
    world, new = _replacement_launched(make_world)
    # meanwhile a budget that allows no disruption of the pod appears: the drain must not start
    world.create(make_pdb("small-pdb", world.ns, match_labels={"app": "small"}, min_available=1))
    world.pdb_computed("small-pdb", 0)
    world.wait_up(new)
    before = world.bound()
    for _ in range(6):
        world.rounds(1, advance=30)
        node = world.nodes()["gpu-big"]
        assert not node["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(node)
        assert world.bound() == before
    [waiting] = [p for p in world.proposals() if p["target"] == world.target("gpu-big")]
    assert f"not draining yet: pdb {world.ns}/small-pdb prevents pod evictions" in waiting["reason"], waiting
    world.rounds(6, advance=30)  # past drainTimeout (5m): undone, the new NodeClaim (no pod) deleted
    node = world.nodes()["gpu-big"]
    assert UNDONE_ANNOTATION in annotations(node) and not node["spec"].get("unschedulable")
    world.wait(lambda: set(world.claims()) == {"gpu-big"}, "the new NodeClaim terminated by Karpenter")
    assert world.bound() == before
    [undone] = [p for p in world.proposals() if p["action"] == "drain undone"]
    assert f"pdb {world.ns}/small-pdb prevents pod evictions" in undone["reason"], undone


def test_a_replacement_killed_between_its_record_and_its_launch_is_finished_by_the_next_leader(
        make_world: Any) -> None:
    world = make_world(checkpoint=crash_at("replacing"))
    _replacement_due(world)
    one_pass_until_the_crash(world)
    assert set(world.claims()) == {"gpu-big"}  # recorded on the node, nothing launched yet
    assert "gpu.kubeon.io/replacing" in annotations(world.nodes()["gpu-big"])
    world.restart()

    def finished() -> bool:
        claims = set(world.claims())
        return len(claims) == 1 and "gpu-big" not in claims and "gpu-big" not in world.nodes() and \
            set(world.bound().values()) == claims
    world.until(finished, "the replacement finished by the next leader")


def test_with_min_pod_age_a_node_is_consolidated_only_once_its_youngest_pod_is_that_old(make_world: Any) -> None:
    world = make_world()
    world.create_policy(capacity_policy(minPodAge="1h"))
    two_nodes_one_pod_each(world)
    world.rounds(3)  # both pods were just bound (their PodScheduled time): too young to move
    assert set(world.claims()) == {"gpu-a", "gpu-b"}
    assert not [p for p in world.proposals() if p["target"].startswith("Node/")]
    world.clock.advance(3600)
    world.until(lambda: len(world.claims()) == 1 and len(world.nodes()) == 1
                and len({n for n in world.bound().values() if n}) == 1, "one node left with both pods")


def test_with_max_evictions_per_pod_0_no_pod_moves_and_an_empty_node_still_goes(make_world: Any) -> None:
    """maxEvictionsPerPod: 0, for pods whose work starts over when evicted: past the minimum age that lets the
    test above give one of two half-used nodes back, both stay with their pods; the node whose pod ended goes."""
    world = make_world()
    world.create_policy(capacity_policy(minPodAge="1h", maxEvictionsPerPod=0))
    two_nodes_one_pod_each(world)
    world.clock.advance(3600)
    world.rounds(3, advance=30)
    assert set(world.claims()) == {"gpu-a", "gpu-b"} and sorted(world.bound().values()) == ["gpu-a", "gpu-b"]
    assert not any(DRAINING_ANNOTATION in annotations(n) for n in world.nodes().values())
    world.cluster.apps.delete_namespaced_deployment("job-b", world.ns)
    world.until(lambda: set(world.claims()) == {"gpu-a"}, "the emptied gpu-b given back", advance=30)
    assert list(world.bound().values()) == ["gpu-a"]


def test_a_replacement_drains_only_once_the_new_nodes_gpus_are_registered(make_world: Any) -> None:
    """A GPU node is Ready minutes before the GPU Operator's device plugin registers its GPUs. A drain
    started then found no room for the pods (the packing model counts registered GPUs), was undone and
    cooled down for an hour; the replacement waits for `nvidia.com/gpu` in the new node's allocatable.
    (Karpenter's KWOK provider puts the instance type's GPUs in a new node's allocatable at once, where a
    kubelet registers none until the device plugin does: the test takes them out and holds the plugin.)"""
    world, new = _replacement_launched(make_world)
    operator = world.cluster.gpu_operator
    world.wait_up(new)  # registered by Karpenter, initialized by KWOK, its GPUs in allocatable at once
    name = world.node_name(new)
    operator.hold(name)
    try:
        gpus = {k: None for k in world.nodes()[new]["status"]["allocatable"] if k.startswith("nvidia.com/")}
        world.cluster.core.patch_node_status(name, {"status": {"allocatable": gpus, "capacity": gpus}})
        for _ in range(3):
            world.runner.run_all()
            world.clock.advance(10)
            big = world.nodes()["gpu-big"]
            assert not big["spec"].get("unschedulable") and DRAINING_ANNOTATION not in annotations(big), \
                "drained before the new node's GPUs were registered"
            assert UNDONE_ANNOTATION not in annotations(big)
        [waiting] = [p for p in world.proposals() if p["target"] == world.target("gpu-big")]
        assert waiting["state"] == "Applied" and "waiting for the new node(s)" in waiting["reason"]
    finally:
        operator.release(name)  # the device plugin registers the GPUs
    world.until(lambda: set(world.claims()) == {new} and "gpu-big" not in world.nodes()
                and set(world.bound().values()) == {new}, "the replacement finished")


def test_a_replacement_in_flight_is_finished_when_its_policy_is_deleted(make_world: Any) -> None:
    """Recorded work is carried on whatever the policies say now: with the last capacity policy deleted,
    the pass returned before looking at replacements, so the new NodeClaim kept running beside the node
    it was launched to replace, and that node was never drained."""
    world, new = _replacement_launched(make_world)
    world.delete_policy("gpu-capacity")
    world.until(lambda: set(world.claims()) == {new} and "gpu-big" not in world.nodes()
                and set(world.bound().values()) == {new}, "the replacement finished")


# -- leadership, the NodePool and claims on their way out ------------------------------------------
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
    world.pending(10)
    leader["held"] = False  # the lease went to another replica
    world.capacity.reconcile(world.ctx)  # the runner skips a standby: this is a pass that lost the lease under way
    assert world.claims() == {}, "a replica without the lease created a NodeClaim"
    leader["held"] = True
    world.runner.run_all()
    assert len(world.claims()) == 1  # the same plan, launched by the leader
    assert {p["state"] for p in world.launches()} == {"Applied"}


def test_launches_wait_while_the_nodepool_cannot_be_declared(make_world: Any) -> None:
    """A NodeClaim names its NodePool, and Karpenter launches nothing for a pool that is missing or not in
    the declared shape. While server-side apply of the pool is refused (another manager owns its GPU limit,
    which the optimizer never forces) launches are approved, not applied, and say what they wait for; once
    the pool can be declared they launch."""
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    world.create_policy(capacity_policy(models=["NVIDIA-A100-SXM4-80GB"]))
    pool = world.scoped("gpu")
    platform = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": pool},
                "spec": {"template": {"spec": {
                    "nodeClassRef": node_class_ref(),
                    "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}},
                    "limits": {"nvidia.com/gpu": "8"}}}
    world.cluster.custom.patch_cluster_custom_object(
        *KARPENTER, "nodepools", pool, platform, field_manager="platform-team",
        _content_type="application/apply-patch+yaml")
    gpu_pods(world, 10, "nvidia.com/mig-1g.10gb")
    world.pending(10)
    world.runner.run_all()
    condition = world.condition("NodePool")
    assert (condition["status"], condition["reason"]) == ("False", "FieldConflict")
    assert world.claims() == {}, "a NodeClaim was launched into a NodePool the controller could not declare"
    [waiting] = world.launches()
    assert waiting["state"] == "Approved" and waiting["reason"].endswith(f"; waiting for NodePool {pool}")
    world.cluster.custom.delete_cluster_custom_object(*KARPENTER, "nodepools", pool)
    world.wait(lambda: world.nodepool() is None, "the platform team's NodePool gone")
    world.runner.run_all()  # the platform team gave the pool up: declared, then launched in the same pass
    assert world.condition("NodePool")["status"] == "True"
    assert len(world.claims()) == 1 and {p["state"] for p in world.launches()} == {"Applied"}


def test_a_nodeclaim_being_deleted_is_no_capacity_for_pending_pods(make_world: Any) -> None:
    """A NodeClaim with a deletionTimestamp is on its way out (Karpenter's finalizer terminates the instance):
    its node will never take the pending pods, so they get a NodeClaim of their own instead of waiting for
    it forever. (Real Karpenter finishes a termination in about a second: a finalizer of the test's own
    keeps the claim on its way out while the controller looks.)"""
    world = make_world()
    world.create_policy(sharing_policy("mig", "MIG"))
    world.create_policy(capacity_policy(models=["NVIDIA-A100-SXM4-80GB"]))
    world.rounds(1)
    leaving = make_nodeclaim(world.scoped("gpu-leaving"), "p4de.24xlarge", nodepool=world.scoped("gpu"),
                             labels={"nvidia.com/mig.config": "all-1g.10gb"},
                             taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    leaving["spec"]["nodeClassRef"] = node_class_ref()
    leaving["metadata"]["finalizers"] = [HOLD]
    world.create(leaving)  # launching, as the burst it was launched for left
    world.cluster.custom.delete_cluster_custom_object(*KARPENTER, "nodeclaims", world.scoped("gpu-leaving"))
    assert world.claims()["gpu-leaving"]["metadata"].get("deletionTimestamp")
    gpu_pods(world, 3, "nvidia.com/mig-1g.10gb")
    world.pending(3)
    world.runner.run_all()
    new = set(world.claims()) - {"gpu-leaving"}
    assert len(new) == 1, "pending pods were left waiting on a NodeClaim that is being deleted"
    [launch] = world.launches()
    assert launch["state"] == "Applied" and world.scoped(new.pop()) in launch["action"]
    assert world.condition("Provisioned")["reason"] == "Planned"


def test_a_launch_karpenter_gives_up_on_is_tried_on_another_type_for_a_while(make_world: Any) -> None:
    """Karpenter deletes a NodeClaim at once when the cloud cannot launch it (insufficient capacity; the KWOK
    provider answers so for a node class it cannot find, which this policy names). The claim names one type
    and a stable name, so it came back every pass, the same type each time, and the pending pods never got a
    node. Now that type is left out of launches for three minutes (Karpenter's own unavailable-offerings
    time), and the reason says so; then it is the first choice again."""
    world = make_world()
    world.create_policy(sharing_policy("share", "TimeSlicing", replicas=4))
    policy = capacity_policy(models=["NVIDIA-L4", "NVIDIA-A10G"], max_gpus=16)
    policy["spec"]["capacity"]["nodeClassRef"] = {**node_class_ref(), "name": "no-such-class"}
    world.create_policy(policy)
    gpu_pods(world, 2, "nvidia.com/gpu.shared")
    world.pending(2)
    world.runner.run_all()
    [(first, claim)] = world.claims().items()
    cheapest = claim["spec"]["requirements"][0]["values"][0]
    world.wait(lambda: first not in world.claims(), "Karpenter deleting the claim it cannot launch")
    world.runner.run_all()
    [(second, claim)] = world.claims().items()
    other = claim["spec"]["requirements"][0]["values"][0]
    assert other != cheapest, "the same type was launched again"
    [tried] = [p for p in world.launches() if world.scoped(second) in p["action"]]
    assert f"not {cheapest} (a launch failed" in tried["reason"], tried["reason"]
    world.wait(lambda: second not in world.claims(), "Karpenter deleting the second claim")
    world.clock.advance(181)  # past the three minutes of the first type (the second is fresh)
    world.runner.run_all()
    [(_, claim)] = world.claims().items()
    assert claim["spec"]["requirements"][0]["values"][0] == cheapest


# -- the controller as installed ------------------------------------------------------------------
def test_the_installed_controller_provisions_for_pending_mig_pods_and_they_run_on_karpenters_node() -> None:
    """The whole install on its own cluster: webhook, extender, second scheduler and the controller as the
    chart renders them (its own process, its leader election and pass periods, `--capacity-provider` from
    the chart). Pending MIG pods get a NodeClaim from the controller; real Karpenter launches it into a KWOK
    node registered with `nvidia.com/gpu` allocatable; the GPU Operator partitions it as the claim's label
    asks; the pods run there."""
    cluster = start_cluster(**{**CLUSTER, "kubeon_components": Kubeon.COMPONENTS,  # the controller too
                               "kubeon_sets": ("prometheus.url=http://127.0.0.1:9",)})  # sharing may act
    try:
        ns = cluster.ensure_namespace("ml")
        for body in (sharing_policy("mig", "MIG"), capacity_policy(models=["NVIDIA-A100-SXM4-80GB"])):
            body["spec"]["selector"] = {"namespaces": [ns]}
            cluster.create(body)
        for i in range(10):
            cluster.create(make_pod(f"p{i}", ns, gpus=1, gpu_resource="nvidia.com/mig-1g.10gb",
                                    tolerations=TOLERATE_GPU))
        cluster.wait_for(lambda: len(cluster.pods(ns, ready=True)) == 10, 180, "the 10 MIG pods running")
        [claim] = read_items(cluster.custom.list_cluster_custom_object(*KARPENTER, "nodeclaims",
                                                                       _preload_content=False))
        assert claim["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubeon-gpu-optimizer"
        assert claim["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p4de.24xlarge"
        assert claim["status"]["allocatable"]["nvidia.com/gpu"] == "8"  # what Karpenter registered
        node = read(cluster.core.read_node(claim["status"]["nodeName"], _preload_content=False))
        assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "56"  # after the MIG manager
        assert {p["spec"]["nodeName"] for p in cluster.pods(ns)} == {node["metadata"]["name"]}
    finally:
        cluster.stop()
