"""`capacity.provider: gke-nodepools` end to end: Google's own SDK clients over HTTP, the real loopback cluster.

Real: etcd, kube-apiserver (with the chart's CRDs and RBAC), kube-controller-manager, kube-scheduler,
KWOK running the nodes; the controller's policy sync and capacity reconciler in this process as the
chart's controller ServiceAccount; google-cloud-container's ClusterManagerClient and google-cloud-compute's
InstanceGroupManagersClient (REST transport, google-api-core's Retry) with credentials from google-auth's
default chain: GOOGLE_APPLICATION_CREDENTIALS names a service account key file (a key made here) whose
token_uri is the local server. Stand-ins, as no cloud runs here:
- tests/controller/gke_server.py answers the operations kube/gke.py calls, shaped from the GKE
  (container) v1 and Compute Engine v1 discovery documents (the APIs google-cloud-container 2.x and
  google-cloud-compute 1.x call; run with 2.67.0 and 1.57.0); a managed instance group's
  instances follow its target size at once;
- `NodeAgent` stands for the node bootstrap (kubelet joining, GPU Feature Discovery, the device plugin):
  each instance of a pool becomes a KWOK Node named as the instance, providerID
  `gce://<project>/<zone>/<instance>`, with its pool's labels and its machine type's GPUs; an instance
  deleted has its Node deleted, as the cloud controller manager does;
- the server's `fault` hook answers a call with the cloud's error where a test needs it: 429
  RESOURCE_EXHAUSTED, 403 PERMISSION_DENIED.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from kubernetes import config
from kubernetes.client.rest import ApiException

from controller.capacity import CapacityReconciler
from controller.context import ControllerContext
from controller.loop import ReconcileRunner
from controller.policies import PolicyStore
from controller.policysync import PolicySync
from controller.recorder import ControllerMetrics, Recorder
from gpupolicy.capacity.nodegroups import GROUP_TAG, MAX_NODES_LABEL, MIN_NODES_LABEL
from gpupolicy.model import Mode
from kube.gke import GkeNodePools
from tests.cluster.cache import CaughtUpCache
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import RELEASE
from tests.cluster.loops import read_items
from tests.cluster.objects import make_node, make_pod
from tests.controller.conftest import ScriptedMetrics
from tests.controller.gke_server import GoogleCloud, Pool, error

CLUSTER = {"kubeon": True, "kubeon_components": ()}
PROJECT, ZONE = "kubeon-test", "us-central1-a"
POLICIES = ("gpu.kubeon.io", "v1alpha1", "gpupolicies")
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
PRODUCTS = {"g2-standard-4": ("NVIDIA-L4", 1), "a2-highgpu-1g": ("NVIDIA-A100-SXM4-40GB", 1)}
WAIT = 60.0
# google-api-core's Retry as kube/gke.py's RETRY, with a shorter schedule: 0.1 s doubling, at most 3 s in all
FAST = gretry.Retry(predicate=gretry.if_exception_type(gexc.TooManyRequests, gexc.ServiceUnavailable),
                    initial=0.1, maximum=0.4, multiplier=2.0, timeout=3.0)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def google() -> Iterator[GoogleCloud]:
    cloud = GoogleCloud(PROJECT)
    try:
        yield cloud
    finally:
        cloud.close()


@pytest.fixture(autouse=True)
def service_account(google: GoogleCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """google-auth's default chain finds this key file (in a cluster: GKE workload identity)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    path = tmp_path / "sa.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "k1", "private_key": key,
        "client_email": f"kubeon@{PROJECT}.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": f"{google.url}/token"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    google.fault = lambda method, path: None
    google.seen.clear()


class NodeAgent:
    """Stand-in for the node bootstrap: a KWOK Node per instance of the cluster's pools, gone with it."""

    def __init__(self, cluster: Cluster, cloud: GoogleCloud, gke: str) -> None:
        self.cluster, self.cloud, self.gke = cluster, cloud, gke
        self.made: set[str] = set()

    def sync(self) -> None:
        pools = self.cloud.clusters.get((ZONE, self.gke), {})
        running = {i: p for p in pools.values() for i in p.instances}
        for instance, pool in running.items():
            if instance not in self.made:
                product, gpus = PRODUCTS[pool.machine_type]
                node = make_node(instance, product, gpus, cpu="96", memory="1024Gi", instance_type=pool.machine_type,
                                 labels={**pool.labels, "cloud.google.com/gke-nodepool": pool.name},
                                 taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
                node["spec"]["providerID"] = f"gce://{PROJECT}/{pool.zone}/{instance}"
                self.cluster.create_node(node)
                self.made.add(instance)
        for instance in sorted(self.made - set(running)):
            try:
                self.cluster.core.delete_node(instance)
            except ApiException as exc:
                if exc.status != 404:
                    raise
            self.made.discard(instance)


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class World:
    """One test: its GKE cluster in the local server, the node agent, the controller (policy sync, capacity)."""

    def __init__(self, cluster: Cluster, namespace: str, google: GoogleCloud, *, gke: str | None = None) -> None:
        self.cluster, self.ns, self.google = cluster, namespace, google
        self.pool = f"gpu-{uuid.uuid4().hex[:6]}"
        self.gke = f"c-{uuid.uuid4().hex[:6]}"
        google.clusters[(ZONE, self.gke)] = {}
        self.agent = NodeAgent(cluster, google, self.gke)
        assert cluster.kubeon is not None
        self.api = config.new_client_from_config(str(cluster.kubeon.kubeconfig_of(cluster.api_client, RELEASE)))
        self.clock = Clock()
        self.ctx = ControllerContext(
            api=self.api, namespace="kubeon-gpu", default_mode=Mode.RECOMMEND,
            prometheus_url="http://prometheus.test:9090", metrics=ScriptedMetrics(), clock=self.clock,
            recorder=Recorder(self.api, ControllerMetrics(), self.clock, "test"), policies=PolicyStore(),
            is_leader=lambda: True, capacity_provider="gke-nodepools",
            cloud={"project": PROJECT, "location": ZONE, "cluster": self.gke},
            cache=CaughtUpCache(self.api, cluster.api_client).start())
        target = gke or self.gke

        def provider(ctx: ControllerContext, products: Any) -> GkeNodePools:
            return GkeNodePools(products, project=PROJECT, location=ZONE, cluster=target,
                                node_list=ctx.cluster().nodes, endpoint=google.url, retry=FAST)
        self.capacity = CapacityReconciler(step_seconds=30.0, provider_factory=provider)
        self.runner = ReconcileRunner(self.ctx, [PolicySync(), self.capacity])
        self.policy = f"{namespace}-capacity"

    def node_pool(self, name: str, machine: str, *, pool: str | None = "", max_nodes: int | None = 4,
                  min_nodes: int | None = None, target: int = 0, autoscaling: bool = False) -> Pool:
        labels = {GROUP_TAG: self.pool if pool == "" else pool} if pool is not None else {}
        if max_nodes is not None:
            labels[MAX_NODES_LABEL] = str(max_nodes)
        if min_nodes is not None:
            labels[MIN_NODES_LABEL] = str(min_nodes)
        made = Pool(name, machine, labels, ZONE, autoscaling=autoscaling, target=target)
        self.google.add_pool(ZONE, self.gke, made)
        return made

    def rounds(self, n: int = 3, advance: float = 10.0, agent: bool = True) -> None:
        for _ in range(n):
            self.runner.run_all()
            if agent:
                self.agent.sync()
            self.clock.advance(advance)

    def create_policy(self, mode: str = "Automatic") -> None:
        capacity: dict[str, Any] = {
            "nodePool": self.pool, "nodeClassRef": {"group": "container.googleapis.com", "kind": "NodePool",
                                                    "name": "unused"},
            "gpuModels": ["NVIDIA-L4", "NVIDIA-A100-SXM4-40GB"], "maxGpus": 64,
            "consolidation": {"underusedBelowPercent": 10, "for": "10m", "maxDisruptedNodes": 1, "emptyFor": "1m",
                              "drainTimeout": "5m"}}
        self.cluster.custom.create_cluster_custom_object(*POLICIES, {
            "apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": self.policy},
            "spec": {"mode": mode, "selector": {"namespaces": [self.ns]}, "capacity": capacity}})

    def pods(self, count: int, prefix: str = "p") -> None:
        for i in range(count):
            self.cluster.create(make_pod(f"{prefix}{i}", self.ns, gpus=1, cpu="1", scheduler_name="default-scheduler",
                                         tolerations=TOLERATE_GPU))

    def condition(self, kind: str) -> dict[str, Any]:
        status = self.cluster.custom.get_cluster_custom_object(*POLICIES, self.policy).get("status") or {}
        return next(c for c in status.get("conditions") or [] if c["type"] == kind)

    def proposals(self) -> list[dict[str, Any]]:
        status = self.cluster.custom.get_cluster_custom_object(*POLICIES, self.policy).get("status") or {}
        return list(status.get("proposals") or [])

    def bound(self) -> dict[str, str | None]:
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.cluster.pods(self.ns)}

    def gpu_nodes(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in read_items(self.cluster.core.list_node(_preload_content=False))
                      if n["metadata"]["name"] in self.agent.made)

    def clean_up(self) -> None:
        assert self.ctx.cache is not None
        self.ctx.cache.stop()
        try:
            self.cluster.custom.delete_cluster_custom_object(*POLICIES, self.policy)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.cluster.core.delete_collection_namespaced_pod(self.ns, grace_period_seconds=0)
        for node in self.agent.made:
            try:
                self.cluster.core.delete_node(node)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self.api.close()


@pytest.fixture
def make_world(kube_cluster: Cluster, namespace: str, google: GoogleCloud) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(**kw: Any) -> World:
        world = World(kube_cluster, namespace, google, **kw)
        made.append(world)
        return world

    yield make
    for world in made:
        world.clean_up()


# -- adding -----------------------------------------------------------------------------------------
def test_pending_gpu_pods_raise_the_cheapest_serving_pool_by_their_count_once(make_world: Any) -> None:
    world = make_world()
    l4 = world.node_pool("l4", "g2-standard-4")
    a100 = world.node_pool("a100", "a2-highgpu-1g")
    other = world.node_pool("l4-unlabelled", "g2-standard-4", pool=None)
    world.create_policy()
    world.pods(3)
    world.rounds(3, agent=False)  # the instances are made; no node has joined yet: counted as launching
    assert (l4.target, a100.target, other.target) == (3, 0, 0)
    assert len(world.google.calls("POST", "/nodePools/l4:setSize")) == 3, "one setSize per node, none again"
    assert world.condition("Provisioned")["reason"] == "NothingPending"
    world.rounds(2)  # the nodes join, the scheduler binds the pods
    world.cluster.wait_for(lambda: all(world.bound().values()), WAIT, "the pods bound")
    world.rounds(3)
    assert l4.target == 3, "the burst was counted once"
    assert set(world.bound().values()) == set(l4.instances)
    nodepool = world.condition("NodePool")
    assert nodepool["status"] == "True" and "l4 (g2-standard-4: 3 of 0..4)" in nodepool["message"], nodepool
    assert "l4-unlabelled" not in nodepool["message"]


def test_a_pool_at_its_max_gets_no_more_and_the_policy_says_so(make_world: Any) -> None:
    world = make_world()
    l4 = world.node_pool("l4", "g2-standard-4", max_nodes=2)
    world.create_policy()
    world.pods(3)
    world.rounds(3)
    assert l4.target == 2
    provisioned = world.condition("Provisioned")
    assert provisioned["status"] == "False" and provisioned["reason"] == "Unserved"
    assert "node group l4 (g2-standard-4) at its max size 2" in provisioned["message"], provisioned


def test_recommend_writes_nothing(make_world: Any) -> None:
    world = make_world()
    l4 = world.node_pool("l4", "g2-standard-4")
    world.create_policy(mode="Recommend")
    world.pods(2)
    world.rounds(3)
    assert l4.target == 0 and l4.instances == []
    proposals = [p for p in world.proposals() if p["action"].startswith("add a node")]
    assert len(proposals) == 2 and {p["state"] for p in proposals} == {"Proposed"}
    assert all("node group l4 (g2-standard-4)" in p["action"] for p in proposals), proposals
    writes = [(m, p) for m, p, _ in world.google.seen if p.endswith((":setSize", "/deleteInstances"))]
    assert writes == [], "reads only: nodePools.list, instanceGroupManagers.get and listManagedInstances"


# -- removing ---------------------------------------------------------------------------------------
def test_an_idle_node_is_drained_and_exactly_its_instance_is_removed(make_world: Any) -> None:
    world = make_world()
    l4 = world.node_pool("l4", "g2-standard-4", target=3)
    world.agent.sync()
    nodes = world.gpu_nodes()
    assert len(nodes) == 3
    for i, node in enumerate(nodes[:2]):  # two busy nodes, the third idle
        world.cluster.create(make_pod(f"busy{i}", world.ns, gpus=1, cpu="1", tolerations=TOLERATE_GPU,
                                      scheduler_name="default-scheduler", node_selector={
                                          "kubernetes.io/hostname": node}))
    world.cluster.wait_for(lambda: all(world.bound().values()), WAIT, "the busy pods bound")
    idle = nodes[2]
    kept = sorted(i for i in l4.instances if i != idle)
    world.create_policy()
    world.cluster.wait_for(lambda: (world.rounds(1, advance=30.0), l4.target == 2)[1], WAIT, "the idle node removed")
    assert sorted(l4.instances) == kept, "exactly the idle node's instance was deleted"
    deleted = world.google.calls("POST", "/deleteInstances")
    assert len(deleted) == 1 and not world.google.calls("POST", ":setSize"), "deleteInstances, never a resize"
    world.rounds(1)
    assert world.gpu_nodes() == kept
    assert all(world.bound().values())


def test_a_pool_at_its_min_size_keeps_its_idle_node(make_world: Any) -> None:
    world = make_world()
    l4 = world.node_pool("l4", "g2-standard-4", target=1, min_nodes=1)
    world.agent.sync()
    world.create_policy()
    world.rounds(6, advance=30.0)
    assert l4.target == 1 and len(l4.instances) == 1
    assert not world.google.calls("POST", "/deleteInstances")


# -- pools left out ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "why"), [
    ({"max_nodes": None}, f"node pool l4 left out: no node label {MAX_NODES_LABEL}"),
    ({"autoscaling": True}, "node pool l4 left out: its cluster autoscaler is on"),
])
def test_a_pool_left_out_is_named_with_why_and_never_resized(make_world: Any, kw: dict[str, Any], why: str) -> None:
    world = make_world()
    l4 = world.node_pool("l4", "g2-standard-4", **kw)
    world.create_policy()
    world.pods(1)
    world.rounds(2)
    condition = world.condition("NodePool")
    assert (condition["status"], condition["reason"]) == ("False", "NodeGroupNotFound")
    assert why in condition["message"] and f"{GROUP_TAG}={world.pool}" in condition["message"], condition
    assert l4.target == 0 and not world.google.calls("POST", ":setSize")


# -- the cloud failing ------------------------------------------------------------------------------
def throttled() -> tuple[int, dict[str, Any]]:
    return error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Write requests' and limit "
                                            "'Write requests per minute' of service 'container.googleapis.com'")


def test_throttling_is_retried_with_back_off_by_google_api_core(make_world: Any) -> None:
    world = make_world()
    l4 = world.node_pool("l4", "g2-standard-4")
    answered: list[str] = []

    def fault(method: str, path: str) -> tuple[int, dict[str, Any]] | None:
        if path.endswith(":setSize") and len(answered) < 2:
            answered.append(path)
            return throttled()
        return None
    world.google.fault = fault
    world.create_policy()
    world.pods(1)
    world.rounds(1, agent=False)
    tries = world.google.calls("POST", "/nodePools/l4:setSize")
    assert len(tries) == 3 and l4.target == 1, "two throttled answers, then the call went through"
    # Retry's back-off: uniform(0, 0.1 s) then uniform(0, 0.2 s) (jitter); both under 5 ms: p < 2e-3
    assert tries[2] - tries[0] > 0.005
    world.rounds(2)
    assert l4.target == 1 and len(world.google.calls("POST", "/nodePools/l4:setSize")) == 3


def test_throttling_past_the_retries_is_a_status_condition_not_a_crash(make_world: Any) -> None:
    world = make_world()
    l4 = world.node_pool("l4", "g2-standard-4")
    world.google.fault = lambda method, path: throttled() if path.endswith(":setSize") else None
    world.create_policy()
    world.pods(1)
    world.rounds(1, agent=False)
    assert len(world.google.calls("POST", ":setSize")) >= 3, "retried until Retry's deadline"
    condition = world.condition("Provider")
    assert (condition["status"], condition["reason"]) == ("False", "RESOURCE_EXHAUSTED")
    assert "Quota exceeded for quota metric 'Write requests'" in condition["message"]
    assert l4.target == 0


def test_permission_denied_is_a_status_condition_with_the_clouds_message(make_world: Any) -> None:
    world = make_world()
    l4 = world.node_pool("l4", "g2-standard-4", target=1)
    denied = ("Required \"container.clusters.get\" permission(s) for \"projects/kubeon-test/locations/"
              "us-central1-a/clusters/c\".")
    world.google.fault = lambda method, path: error(403, "PERMISSION_DENIED", denied) \
        if path.startswith("/v1/") else None
    world.create_policy()
    world.pods(2)
    world.rounds(2, agent=False)
    condition = world.condition("Provider")
    assert (condition["status"], condition["reason"]) == ("False", "PERMISSION_DENIED")
    assert "Required \"container.clusters.get\" permission(s)" in condition["message"]
    assert l4.target == 1 and not world.google.calls("POST", ":setSize")


def test_a_cluster_that_does_not_exist_is_a_status_condition(make_world: Any) -> None:
    world = make_world(gke="no-such-cluster")
    l4 = world.node_pool("l4", "g2-standard-4")
    world.create_policy()
    world.pods(1)
    world.rounds(2, agent=False)
    condition = world.condition("Provider")
    assert (condition["status"], condition["reason"]) == ("False", "NOT_FOUND")
    assert "no-such-cluster" in condition["message"]
    assert l4.target == 0
