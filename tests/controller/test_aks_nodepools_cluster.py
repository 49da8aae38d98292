"""`capacity.provider: aks-nodepools` end to end: the Azure SDK's own clients over HTTPS, the real loopback cluster.

Real: etcd, kube-apiserver (with the chart's CRDs and RBAC), kube-controller-manager, kube-scheduler,
KWOK running the nodes; the controller's policy sync and capacity reconciler in this process as the
chart's controller ServiceAccount; azure-mgmt-containerservice's ContainerServiceClient (API version
2026-08-01, azure-core's RetryPolicy) with azure-identity's DefaultAzureCredential, which finds a managed
identity through IDENTITY_ENDPOINT and IDENTITY_HEADER (the App Service form) pointing at the local server.
Stand-ins, as no cloud runs here:
- tests/controller/aks_server.py answers the operations kube/aks.py calls, shaped from
  azure-rest-api-specs, specification/containerservice, Microsoft.ContainerService 2026-08-01, over
  HTTPS with a certificate from a CA made here (REQUESTS_CA_BUNDLE), as ARM is HTTPS only; an agent
  pool's machines follow its count at once;
- `NodeAgent` stands for the node bootstrap: each machine of a pool becomes a KWOK Node named as the
  machine, providerID `azure://<its VM's resource id>`, with its pool's node labels and its VM size's
  GPUs; a machine deleted has its Node deleted, as the cloud controller manager does;
- the server's `fault` hook answers a call with ARM's error where a test needs it: 429 with Retry-After,
  403 AuthorizationFailed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
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
from kube.aks import AksNodePools
from tests.cluster.cache import CaughtUpCache
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import RELEASE
from tests.cluster.loops import read_items
from tests.cluster.objects import make_node, make_pod
from tests.cluster.pki import write_pki, write_serving_pair
from tests.controller.aks_server import IDENTITY_HEADER, AgentPool, AzureCloud, error
from tests.controller.conftest import ScriptedMetrics

CLUSTER = {"kubeon": True, "kubeon_components": ()}
SUBSCRIPTION, GROUP = "00000000-0000-0000-0000-00000000c0de", "rg-gpu"
POLICIES = ("gpu.kubeon.io", "v1alpha1", "gpupolicies")
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
PRODUCTS = {"Standard_NC4as_T4_v3": ("Tesla-T4", 1), "Standard_NC24ads_A100_v4": ("NVIDIA-A100-SXM4-80GB", 1)}
T4, A100 = "Standard_NC4as_T4_v3", "Standard_NC24ads_A100_v4"
WAIT = 60.0
RETRIES = 3  # azure-core RetryPolicy retry_total here (kube/aks.py: RETRY_TOTAL), back-off 0.1 s doubling

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def azure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureCloud]:
    pki = tmp_path_factory.mktemp("arm-pki")
    write_pki(pki)
    pair = write_serving_pair(pki / "arm", pki, "management.local", ["localhost"], ["127.0.0.1"])
    cloud = AzureCloud(SUBSCRIPTION, pair["tls_crt"], pair["tls_key"], pair["ca_crt"])
    try:
        yield cloud
    finally:
        cloud.close()


@pytest.fixture(autouse=True)
def managed_identity(azure: AzureCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """DefaultAzureCredential finds a managed identity here (in a cluster: Azure workload identity)."""
    for key in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE",
                "AZURE_USERNAME", "MSI_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("IDENTITY_ENDPOINT", f"{azure.url}/msi/token")
    monkeypatch.setenv("IDENTITY_HEADER", IDENTITY_HEADER)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(azure.ca))  # requests (azure-core's transport) trusts the CA
    azure.fault = lambda method, path: None
    azure.seen.clear()


class NodeAgent:
    """Stand-in for the node bootstrap: a KWOK Node per machine of the cluster's agent pools, gone with it."""

    def __init__(self, cluster: Cluster, cloud: AzureCloud, aks: str) -> None:
        self.cluster, self.cloud, self.aks = cluster, cloud, aks
        self.made: set[str] = set()

    def sync(self) -> None:
        pools = self.cloud.clusters.get((GROUP, self.aks), {})
        running = {m: (p, i) for p in pools.values() for m, i in p.machines.items()}
        for machine, (pool, index) in running.items():
            if machine not in self.made:
                product, gpus = PRODUCTS[pool.vm_size]
                node = make_node(machine, product, gpus, cpu="96", memory="1024Gi", instance_type=pool.vm_size,
                                 labels={**pool.labels, "kubernetes.azure.com/agentpool": pool.name},
                                 taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
                node["spec"]["providerID"] = "azure://" + pool.resource_id(SUBSCRIPTION, GROUP, self.aks, index)
                self.cluster.create_node(node)
                self.made.add(machine)
        for machine in sorted(self.made - set(running)):
            try:
                self.cluster.core.delete_node(machine)
            except ApiException as exc:
                if exc.status != 404:
                    raise
            self.made.discard(machine)


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class World:
    """One test: its AKS cluster in the local server, the node agent, the controller (policy sync, capacity)."""

    def __init__(self, cluster: Cluster, namespace: str, azure: AzureCloud, *, aks: str | None = None) -> None:
        self.cluster, self.ns, self.azure = cluster, namespace, azure
        self.pool = f"gpu-{uuid.uuid4().hex[:6]}"
        self.aks = f"c-{uuid.uuid4().hex[:6]}"
        azure.clusters[(GROUP, self.aks)] = {}
        self.agent = NodeAgent(cluster, azure, self.aks)
        assert cluster.kubeon is not None
        self.api = config.new_client_from_config(str(cluster.kubeon.kubeconfig_of(cluster.api_client, RELEASE)))
        self.clock = Clock()
        self.ctx = ControllerContext(
            api=self.api, namespace="kubeon-gpu", default_mode=Mode.RECOMMEND,
            prometheus_url="http://prometheus.test:9090", metrics=ScriptedMetrics(), clock=self.clock,
            recorder=Recorder(self.api, ControllerMetrics(), self.clock, "test"), policies=PolicyStore(),
            is_leader=lambda: True, capacity_provider="aks-nodepools",
            cloud={"subscription": SUBSCRIPTION, "resourceGroup": GROUP, "cluster": self.aks},
            cache=CaughtUpCache(self.api, cluster.api_client).start())
        target = aks or self.aks

        def provider(ctx: ControllerContext, products: Any) -> AksNodePools:
            return AksNodePools(products, subscription=SUBSCRIPTION, resource_group=GROUP, cluster=target,
                                node_list=ctx.cluster().nodes, endpoint=azure.url, retry_total=RETRIES,
                                retry_backoff=0.1)
        self.capacity = CapacityReconciler(step_seconds=30.0, provider_factory=provider)
        self.runner = ReconcileRunner(self.ctx, [PolicySync(), self.capacity])
        self.policy = f"{namespace}-capacity"

    def node_pool(self, name: str, vm_size: str, *, pool: str | None = "", max_nodes: int | None = 4,
                  min_nodes: int | None = None, count: int = 0, autoscaling: bool = False) -> AgentPool:
        labels = {GROUP_TAG: self.pool if pool == "" else pool} if pool is not None else {}
        if max_nodes is not None:
            labels[MAX_NODES_LABEL] = str(max_nodes)
        if min_nodes is not None:
            labels[MIN_NODES_LABEL] = str(min_nodes)
        made = AgentPool(name, vm_size, labels, count=count, autoscaling=autoscaling)
        self.azure.add_pool(GROUP, self.aks, made)
        return made

    def rounds(self, n: int = 3, advance: float = 10.0, agent: bool = True) -> None:
        for _ in range(n):
            self.runner.run_all()
            if agent:
                self.agent.sync()
            self.clock.advance(advance)

    def create_policy(self, mode: str = "Automatic") -> None:
        capacity: dict[str, Any] = {
            "nodePool": self.pool, "nodeClassRef": {"group": "containerservice.azure.com", "kind": "AgentPool",
                                                    "name": "unused"},
            "gpuModels": ["Tesla-T4", "NVIDIA-A100-SXM4-80GB"], "maxGpus": 64,
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
def make_world(kube_cluster: Cluster, namespace: str, azure: AzureCloud) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(**kw: Any) -> World:
        world = World(kube_cluster, namespace, azure, **kw)
        made.append(world)
        return world

    yield make
    for world in made:
        world.clean_up()


POOLS = "/agentPools"


# -- adding -----------------------------------------------------------------------------------------
def test_pending_gpu_pods_raise_the_cheapest_serving_pool_by_their_count_once(make_world: Any) -> None:
    world = make_world()
    t4 = world.node_pool("t4", T4)
    a100 = world.node_pool("a100", A100)
    other = world.node_pool("t4-unlabelled", T4, pool=None)
    world.create_policy()
    world.pods(3)
    world.rounds(3, agent=False)  # the machines are made; no node has joined yet: counted as launching
    assert (t4.count, a100.count, other.count) == (3, 0, 0)
    assert len(world.azure.calls("PUT", f"{POOLS}/t4")) == 3, "one createOrUpdate per node, none again"
    assert world.condition("Provisioned")["reason"] == "NothingPending"
    world.rounds(2)  # the nodes join, the scheduler binds the pods
    world.cluster.wait_for(lambda: all(world.bound().values()), WAIT, "the pods bound")
    world.rounds(3)
    assert t4.count == 3, "the burst was counted once"
    assert set(world.bound().values()) == set(t4.machines)
    nodepool = world.condition("NodePool")
    assert nodepool["status"] == "True" and f"t4 ({T4}: 3 of 0..4)" in nodepool["message"], nodepool
    assert "t4-unlabelled" not in nodepool["message"]


def test_a_pool_at_its_max_gets_no_more_and_the_policy_says_so(make_world: Any) -> None:
    world = make_world()
    t4 = world.node_pool("t4", T4, max_nodes=2)
    world.create_policy()
    world.pods(3)
    world.rounds(3)
    assert t4.count == 2
    provisioned = world.condition("Provisioned")
    assert provisioned["status"] == "False" and provisioned["reason"] == "Unserved"
    assert f"node group t4 ({T4}) at its max size 2" in provisioned["message"], provisioned


def test_recommend_writes_nothing(make_world: Any) -> None:
    world = make_world()
    t4 = world.node_pool("t4", T4)
    world.create_policy(mode="Recommend")
    world.pods(2)
    world.rounds(3)
    assert t4.count == 0 and t4.machines == {}
    proposals = [p for p in world.proposals() if p["action"].startswith("add a node")]
    assert len(proposals) == 2 and {p["state"] for p in proposals} == {"Proposed"}
    assert all(f"node group t4 ({T4})" in p["action"] for p in proposals), proposals
    assert {m for m, _, _ in world.azure.seen} == {"GET"}, "reads only: agentPools list and get, machines list"


# -- removing ---------------------------------------------------------------------------------------
def test_an_idle_node_is_drained_and_exactly_its_machine_is_removed(make_world: Any) -> None:
    world = make_world()
    t4 = world.node_pool("t4", T4, count=3)
    world.agent.sync()
    nodes = world.gpu_nodes()
    assert len(nodes) == 3
    for i, node in enumerate(nodes[:2]):  # two busy nodes, the third idle
        world.cluster.create(make_pod(f"busy{i}", world.ns, gpus=1, cpu="1", tolerations=TOLERATE_GPU,
                                      scheduler_name="default-scheduler", node_selector={
                                          "kubernetes.io/hostname": node}))
    world.cluster.wait_for(lambda: all(world.bound().values()), WAIT, "the busy pods bound")
    idle = nodes[2]
    kept = sorted(m for m in t4.machines if m != idle)
    world.create_policy()
    world.cluster.wait_for(lambda: (world.rounds(1, advance=30.0), t4.count == 2)[1], WAIT, "the idle node removed")
    assert sorted(t4.machines) == kept, "exactly the idle node's machine was deleted"
    assert len(world.azure.calls("POST", "/deleteMachines")) == 1 and not world.azure.calls("PUT", f"{POOLS}/t4")
    world.rounds(1)
    assert world.gpu_nodes() == kept
    assert all(world.bound().values())


def test_a_pool_at_its_min_size_keeps_its_idle_node(make_world: Any) -> None:
    world = make_world()
    t4 = world.node_pool("t4", T4, count=1, min_nodes=1)
    world.agent.sync()
    world.create_policy()
    world.rounds(6, advance=30.0)
    assert t4.count == 1 and len(t4.machines) == 1
    assert not world.azure.calls("POST", "/deleteMachines")


# -- pools left out ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "why"), [
    ({"max_nodes": None}, f"agent pool t4 left out: no node label {MAX_NODES_LABEL}"),
    ({"autoscaling": True}, "agent pool t4 left out: its cluster autoscaler is on"),
])
def test_a_pool_left_out_is_named_with_why_and_never_resized(make_world: Any, kw: dict[str, Any], why: str) -> None:
    world = make_world()
    t4 = world.node_pool("t4", T4, **kw)
    world.create_policy()
    world.pods(1)
    world.rounds(2)
    condition = world.condition("NodePool")
    assert (condition["status"], condition["reason"]) == ("False", "NodeGroupNotFound")
    assert why in condition["message"] and f"{GROUP_TAG}={world.pool}" in condition["message"], condition
    assert t4.count == 0 and not world.azure.calls("PUT", f"{POOLS}/t4")


# -- the cloud failing ------------------------------------------------------------------------------
def throttled() -> tuple[int, dict[str, Any], dict[str, str]]:
    """ARM's answer to a throttled write: 429 with Retry-After (seconds)."""
    return error(429, "TooManyRequests", "The request is being throttled as the limit has been reached for "
                                         "operation type - Write_ObservationWindow_1Minutes.", {"Retry-After": "1"})


def test_throttling_is_retried_after_retry_after_by_azure_core(make_world: Any) -> None:
    world = make_world()
    t4 = world.node_pool("t4", T4)
    answered: list[str] = []

    def fault(method: str, path: str) -> tuple[int, dict[str, Any], dict[str, str]] | None:
        if method == "PUT" and len(answered) < 2:
            answered.append(path)
            return throttled()
        return None
    world.azure.fault = fault
    world.create_policy()
    world.pods(1)
    world.rounds(1, agent=False)
    tries = world.azure.calls("PUT", f"{POOLS}/t4")
    assert len(tries) == 3 and t4.count == 1, "two throttled answers, then the call went through"
    assert tries[1] - tries[0] >= 1.0 and tries[2] - tries[1] >= 1.0, "each retry waited Retry-After: 1 s"
    world.rounds(2)
    assert t4.count == 1 and len(world.azure.calls("PUT", f"{POOLS}/t4")) == 3


def test_throttling_past_the_retries_is_a_status_condition_not_a_crash(make_world: Any) -> None:
    world = make_world()
    t4 = world.node_pool("t4", T4)
    world.azure.fault = lambda method, path: throttled() if method == "PUT" else None
    world.create_policy()
    world.pods(1)
    world.rounds(1, agent=False)
    assert len(world.azure.calls("PUT", f"{POOLS}/t4")) == 1 + RETRIES, "the first try and retry_total retries"
    condition = world.condition("Provider")
    assert (condition["status"], condition["reason"]) == ("False", "TooManyRequests")
    assert "The request is being throttled" in condition["message"]
    assert t4.count == 0


def test_permission_denied_is_a_status_condition_with_the_clouds_message(make_world: Any) -> None:
    world = make_world()
    t4 = world.node_pool("t4", T4, count=1)
    denied = (f"The client 'kubeon' with object id '1111' does not have authorization to perform action "
              f"'Microsoft.ContainerService/managedClusters/agentPools/read' over scope '/subscriptions/"
              f"{SUBSCRIPTION}/resourceGroups/{GROUP}' or the scope is invalid.")
    world.azure.fault = lambda method, path: error(403, "AuthorizationFailed", denied)
    world.create_policy()
    world.pods(2)
    world.rounds(2, agent=False)
    condition = world.condition("Provider")
    assert (condition["status"], condition["reason"]) == ("False", "AuthorizationFailed")
    assert "does not have authorization to perform action" in condition["message"]
    assert t4.count == 1 and not world.azure.calls("PUT", f"{POOLS}/t4")


def test_a_cluster_that_does_not_exist_is_a_status_condition(make_world: Any) -> None:
    world = make_world(aks="no-such-cluster")
    t4 = world.node_pool("t4", T4)
    world.create_policy()
    world.pods(1)
    world.rounds(2, agent=False)
    condition = world.condition("Provider")
    assert (condition["status"], condition["reason"]) == ("False", "ResourceNotFound")
    assert "no-such-cluster" in condition["message"]
    assert t4.count == 0
