"""`capacity.provider: eks-nodegroups` end to end: real boto3 over HTTP to moto, the real loopback cluster.

Real: etcd, kube-apiserver (with the chart's CRDs and RBAC), kube-controller-manager, kube-scheduler,
KWOK running the nodes; the controller's policy sync and capacity reconciler in this process as the
chart's controller ServiceAccount; boto3 and botocore (its standard retry mode) calling a moto server
(moto 5, `ThreadedMotoServer`) started by this module over HTTP on 127.0.0.1, with credentials from
boto3's default chain (the environment). moto keeps the EKS clusters, node groups and Auto Scaling
groups: SetDesiredCapacity launches its instances, TerminateInstanceInAutoScalingGroup ends them.
Stand-ins, as no cloud runs here:
- moto's EKS names a node group's Auto Scaling group but does not create it: `Cloud.group` creates it
  in moto's Auto Scaling, as EKS does;
- `NodeAgent` stands for the cloud's node bootstrap (kubelet joining, GPU Feature Discovery, the device
  plugin): each running instance of a group becomes a KWOK Node whose providerID names it
  (`aws:///<zone>/<instance id>`), with its group's labels and the GPUs of its type; an instance ended
  has its Node deleted, as the cloud controller manager does;
- `FaultProxy` sits between boto3 and moto where a test needs the cloud to throttle or refuse:
  ThrottlingException as Auto Scaling's Query API answers it (HTTP 400, `Throttling`), and EKS's
  `AccessDeniedException` (HTTP 403, `x-amzn-ErrorType`, its REST-JSON shape, EKS API reference
  2017-11-01). moto 5.2 enforces IAM for Auto Scaling but fails every EKS call under enforcement with
  SignatureDoesNotMatch, so a refusal of EKS's own words comes from the proxy.
"""

from __future__ import annotations

import http.client
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from kubernetes import config
from kubernetes.client.rest import ApiException
from moto.server import ThreadedMotoServer

from controller.capacity import CapacityReconciler
from controller.context import ControllerContext
from controller.loop import ReconcileRunner
from controller.policies import PolicyStore
from controller.policysync import PolicySync
from controller.recorder import ControllerMetrics, Recorder
from gpupolicy.capacity.nodegroups import GROUP_TAG
from gpupolicy.model import Mode
from kube.eks import EksNodeGroups
from tests.cluster.cache import CaughtUpCache
from tests.cluster.cluster import Cluster
from tests.cluster.kubeon import RELEASE
from tests.cluster.loops import read_items
from tests.cluster.objects import make_node, make_pod
from tests.controller.conftest import ScriptedMetrics

# The chart's CRDs and RBAC (the controller runs in this process as its ServiceAccount); no component runs.
CLUSTER = {"kubeon": True, "kubeon_components": ()}
REGION = "us-east-1"
POLICIES = ("gpu.kubeon.io", "v1alpha1", "gpupolicies")
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
PRODUCTS = {"g6.xlarge": ("NVIDIA-L4", 1), "g5.xlarge": ("NVIDIA-A10G", 1), "g6.12xlarge": ("NVIDIA-L4", 4),
            "p4de.24xlarge": ("NVIDIA-A100-SXM4-80GB", 8)}
WAIT = 60.0

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's default chain finds these (in a cluster: IRSA or Pod Identity)."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


class Cloud:
    """One test's EKS cluster in moto, its node groups and their Auto Scaling groups."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.eks = boto3.client("eks", region_name=REGION, endpoint_url=url)
        self.autoscaling = boto3.client("autoscaling", region_name=REGION, endpoint_url=url)
        self.ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)
        self.eks.create_cluster(name=name, roleArn="arn:aws:iam::123456789012:role/eks",
                                resourcesVpcConfig={"subnetIds": []})
        self.scalers: dict[str, str] = {}  # node group -> its Auto Scaling group

    def group(self, name: str, instance_type: str, *, pool: str | None, min_size: int = 0, max_size: int = 4,
              desired: int = 0, labels: dict[str, str] | None = None) -> str:
        """A managed node group (tagged for `pool`, untagged with None) and its Auto Scaling group."""
        tags = {GROUP_TAG: pool} if pool else {}
        made = self.eks.create_nodegroup(
            clusterName=self.name, nodegroupName=name, nodeRole="arn:aws:iam::123456789012:role/node",
            subnets=["subnet-1"], instanceTypes=[instance_type], tags=tags, labels=labels or {},
            scalingConfig={"minSize": min_size, "maxSize": max_size, "desiredSize": desired})["nodegroup"]
        scaler = made["resources"]["autoScalingGroups"][0]["name"]
        template = f"{scaler}-lt"
        self.ec2.create_launch_template(LaunchTemplateName=template, LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": instance_type})
        self.autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=scaler, LaunchTemplate={"LaunchTemplateName": template}, MinSize=min_size,
            MaxSize=max_size, DesiredCapacity=desired, AvailabilityZones=[f"{REGION}a"])
        self.scalers[name] = scaler
        return scaler

    def scaler(self, group: str) -> dict[str, Any]:
        found: dict[str, Any] = self.autoscaling.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.scalers[group]])["AutoScalingGroups"][0]
        return found

    def desired(self, group: str) -> int:
        return int(self.scaler(group)["DesiredCapacity"])

    def instances(self, group: str) -> list[str]:
        return sorted(i["InstanceId"] for i in self.scaler(group)["Instances"]
                      if not i["LifecycleState"].startswith("Terminat"))

    def labels(self, group: str) -> dict[str, str]:
        return dict(self.eks.describe_nodegroup(clusterName=self.name, nodegroupName=group)["nodegroup"]["labels"])


class NodeAgent:
    """Stand-in for the node bootstrap: a KWOK Node per running instance of the cloud's groups, gone with it."""

    def __init__(self, cluster: Cluster, cloud: Cloud) -> None:
        self.cluster, self.cloud = cluster, cloud
        self.made: dict[str, str] = {}  # instance id -> Node name

    def sync(self) -> None:
        running: set[str] = set()
        for group in self.cloud.scalers:
            scaler = self.cloud.scaler(group)
            for inst in scaler["Instances"]:
                if inst["LifecycleState"].startswith("Terminat"):
                    continue
                running.add(inst["InstanceId"])
                if inst["InstanceId"] not in self.made:
                    self._join(group, inst)
        for instance, node in list(self.made.items()):
            if instance not in running:
                try:
                    self.cluster.core.delete_node(node)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                del self.made[instance]

    def _join(self, group: str, inst: dict[str, Any]) -> None:
        product, gpus = PRODUCTS[inst["InstanceType"]]
        name = inst["InstanceId"].lower()
        node = make_node(name, product, gpus, cpu="96", memory="1024Gi", instance_type=inst["InstanceType"],
                         labels={**self.cloud.labels(group), "eks.amazonaws.com/nodegroup": group},
                         taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
        node["spec"]["providerID"] = f"aws:///{inst['AvailabilityZone']}/{inst['InstanceId']}"
        self.cluster.create_node(node)
        self.made[inst["InstanceId"]] = name


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class World:
    """One test: its EKS cluster in moto, the node agent, and the controller (policy sync, capacity)."""

    def __init__(self, cluster: Cluster, namespace: str, moto_url: str, *,
                 endpoint: str | None = None, max_attempts: int | None = None, eks_cluster: str | None = None
                 ) -> None:
        self.cluster, self.ns = cluster, namespace
        self.pool = f"gpu-{uuid.uuid4().hex[:6]}"
        self.cloud = Cloud(moto_url, f"c-{namespace}"[:100])
        self.agent = NodeAgent(cluster, self.cloud)
        assert cluster.kubeon is not None
        self.api = config.new_client_from_config(str(cluster.kubeon.kubeconfig_of(cluster.api_client, RELEASE)))
        self.clock = Clock()
        self.ctx = ControllerContext(
            api=self.api, namespace="kubeon-gpu", default_mode=Mode.RECOMMEND,
            prometheus_url="http://prometheus.test:9090", metrics=ScriptedMetrics(), clock=self.clock,
            recorder=Recorder(self.api, ControllerMetrics(), self.clock, "test"), policies=PolicyStore(),
            is_leader=lambda: True, capacity_provider="eks-nodegroups",
            cloud={"cluster": self.cloud.name, "region": REGION},
            cache=CaughtUpCache(self.api, cluster.api_client).start())  # the passes run back to back
        kwargs: dict[str, Any] = {} if max_attempts is None else {"max_attempts": max_attempts}
        target = eks_cluster or self.cloud.name

        def provider(ctx: ControllerContext, products: Any) -> EksNodeGroups:
            return EksNodeGroups(ctx.api, products, cluster=target, node_list=ctx.cluster().nodes, region=REGION,
                                 endpoint_url=endpoint or moto_url, **kwargs)
        self.capacity = CapacityReconciler(step_seconds=30.0, provider_factory=provider)
        self.runner = ReconcileRunner(self.ctx, [PolicySync(), self.capacity])
        self.policy = f"{namespace}-capacity"

    def rounds(self, n: int = 3, advance: float = 10.0, agent: bool = True) -> None:
        """`n` controller passes, the node agent after each (with `agent`), the clock moved `advance` s."""
        for _ in range(n):
            self.runner.run_all()
            if agent:
                self.agent.sync()
            self.clock.advance(advance)

    def create_policy(self, mode: str = "Automatic", max_gpus: int | None = 64,
                      models: tuple[str, ...] = ("NVIDIA-L4", "NVIDIA-A10G")) -> None:
        capacity: dict[str, Any] = {
            "nodePool": self.pool, "nodeClassRef": {"group": "eks.amazonaws.com", "kind": "NodeGroup",
                                                    "name": "unused"},
            "gpuModels": list(models),
            "consolidation": {"underusedBelowPercent": 10, "for": "10m", "maxDisruptedNodes": 1, "emptyFor": "1m",
                              "drainTimeout": "5m"}}
        if max_gpus is not None:
            capacity["maxGpus"] = max_gpus
        self.cluster.custom.create_cluster_custom_object(*POLICIES, {
            "apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": self.policy},
            "spec": {"mode": mode, "selector": {"namespaces": [self.ns]}, "capacity": capacity}})

    def pods(self, count: int, prefix: str = "p", **kw: Any) -> None:
        for i in range(count):
            self.cluster.create(make_pod(f"{prefix}{i}", self.ns, gpus=1, cpu="1", scheduler_name="default-scheduler",
                                         tolerations=TOLERATE_GPU, **kw))

    def status(self) -> dict[str, Any]:
        return dict(self.cluster.custom.get_cluster_custom_object(*POLICIES, self.policy).get("status") or {})

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status().get("conditions") or [] if c["type"] == kind)

    def bound(self) -> dict[str, str | None]:
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.cluster.pods(self.ns)}

    def gpu_nodes(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in read_items(self.cluster.core.list_node(_preload_content=False))
                      if n["metadata"]["name"] in self.agent.made.values())

    def clean_up(self) -> None:
        assert self.ctx.cache is not None
        self.ctx.cache.stop()
        try:
            self.cluster.custom.delete_cluster_custom_object(*POLICIES, self.policy)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.cluster.core.delete_collection_namespaced_pod(self.ns, grace_period_seconds=0)
        for node in self.agent.made.values():
            try:
                self.cluster.core.delete_node(node)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self.api.close()


@pytest.fixture
def make_world(kube_cluster: Cluster, namespace: str, moto_url: str) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(**kw: Any) -> World:
        world = World(kube_cluster, namespace, moto_url, **kw)
        made.append(world)
        return world

    yield make
    for world in made:
        world.clean_up()


class FaultProxy:
    """Between boto3 and moto: answers the calls `fault` picks with the cloud's error, forwards the rest."""

    def __init__(self, upstream: str, fault: Callable[[str, str], tuple[int, dict[str, str], bytes] | None]) -> None:
        self.upstream = urlsplit(upstream)
        self.fault = fault
        self.seen: list[tuple[str, float]] = []  # (operation, when) of every request
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                action = parse_qs(body.decode(errors="replace")).get("Action", [""])[0] or \
                    f"{self.command} {urlsplit(self.path).path}"
                proxy.seen.append((action, time.monotonic()))
                answer = proxy.fault(action, self.path)
                if answer is None:
                    conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                    conn.request(self.command, self.path, body, {k: v for k, v in self.headers.items()})
                    got = conn.getresponse()
                    answer = (got.status, {k: v for k, v in got.getheaders()
                                           if k.lower() not in ("transfer-encoding", "connection")}, got.read())
                    conn.close()
                status, headers, data = answer
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, action: str) -> int:
        return sum(1 for a, _ in self.seen if a == action)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def throttled() -> tuple[int, dict[str, str], bytes]:
    """Auto Scaling's Query API answer to a throttled call."""
    return 400, {"Content-Type": "text/xml"}, (
        b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message>"
        b"</Error><RequestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</RequestId></ErrorResponse>")


# -- adding -----------------------------------------------------------------------------------------
def test_pending_gpu_pods_raise_the_cheapest_serving_group_by_their_count_once(make_world: Any) -> None:
    world = make_world()
    cloud = world.cloud
    cloud.group("l4", "g6.xlarge", pool=world.pool)
    cloud.group("a10g", "g5.xlarge", pool=world.pool)
    cloud.group("l4-untagged", "g6.xlarge", pool=None)
    world.create_policy()
    world.pods(3)
    world.rounds(3, agent=False)  # the instances launch; no node has joined yet: counted as launching
    assert (cloud.desired("l4"), cloud.desired("a10g"), cloud.desired("l4-untagged")) == (3, 0, 0)
    assert len(cloud.instances("l4")) == 3
    assert world.condition("Provisioned")["reason"] == "NothingPending"
    world.rounds(2)  # the nodes join, the scheduler binds the pods
    world.cluster.wait_for(lambda: all(world.bound().values()), WAIT, "the pods bound")
    world.rounds(3)
    assert cloud.desired("l4") == 3, "the burst was counted once"
    assert set(world.bound().values()) == {i.lower() for i in cloud.instances("l4")}
    nodepool = world.condition("NodePool")
    assert nodepool["status"] == "True" and "l4 (g6.xlarge: 3 of 0..4)" in nodepool["message"]
    assert "l4-untagged" not in nodepool["message"]


def test_pending_mig_pods_raise_the_group_booting_their_layout(make_world: Any) -> None:
    """The group is chosen by the sharing layout too: its labels boot the MIG layout (the GPU Operator shim
    partitions the node as it joins) and the pods run there."""
    world = make_world()
    cloud = world.cloud
    cloud.group("a100", "p4de.24xlarge", pool=world.pool)
    cloud.group("a100-mig", "p4de.24xlarge", pool=world.pool, labels={"nvidia.com/mig.config": "all-1g.10gb"})
    world.create_policy(models=("NVIDIA-A100-SXM4-80GB",))
    world.pods(10, gpu_resource="nvidia.com/mig-1g.10gb")
    world.rounds(3)
    assert (cloud.desired("a100-mig"), cloud.desired("a100")) == (1, 0)  # 10 x 1/7 GPU: one 8-GPU node
    world.cluster.wait_for(lambda: (world.rounds(1), all(world.bound().values()))[1], WAIT, "the MIG pods bound")
    assert set(world.bound().values()) == {i.lower() for i in cloud.instances("a100-mig")}
    assert cloud.desired("a100-mig") == 1


def test_a_group_at_its_max_gets_no_more_and_the_policy_says_so(make_world: Any) -> None:
    world = make_world()
    world.cloud.group("l4", "g6.xlarge", pool=world.pool, max_size=2)
    world.create_policy()
    world.pods(3)
    world.rounds(3)
    assert world.cloud.desired("l4") == 2
    provisioned = world.condition("Provisioned")
    assert provisioned["status"] == "False" and provisioned["reason"] == "Unserved"
    assert "node group l4 (g6.xlarge) at its max size 2" in provisioned["message"], provisioned


def test_recommend_writes_nothing(make_world: Any, moto_url: str) -> None:
    proxy = FaultProxy(moto_url, lambda action, path: None)  # forwards all, records each call
    try:
        world = make_world(endpoint=proxy.url)
        world.cloud.group("l4", "g6.xlarge", pool=world.pool)
        world.create_policy(mode="Recommend")
        world.pods(2)
        world.rounds(3)
        assert world.cloud.desired("l4") == 0 and world.cloud.instances("l4") == []
        proposals = [p for p in world.status().get("proposals") or [] if p["action"].startswith("add a node")]
        assert len(proposals) == 2 and {p["state"] for p in proposals} == {"Proposed"}
        assert all("node group l4 (g6.xlarge)" in p["action"] for p in proposals)
        calls = {action.split("/")[0] if action.startswith("GET") else action for action, _ in proxy.seen}
        assert calls == {"GET ", "DescribeAutoScalingGroups"}, "reads only: EKS GETs and Auto Scaling's Describe"
    finally:
        proxy.close()


# -- removing ---------------------------------------------------------------------------------------
def test_an_idle_node_is_drained_and_exactly_its_instance_is_removed(make_world: Any) -> None:
    world = make_world()
    cloud = world.cloud
    cloud.group("l4", "g6.xlarge", pool=world.pool, desired=3)
    world.agent.sync()
    nodes = world.gpu_nodes()
    assert len(nodes) == 3
    for i, node in enumerate(nodes[:2]):  # two busy nodes, the third idle
        world.cluster.create(make_pod(f"busy{i}", world.ns, gpus=1, cpu="1", tolerations=TOLERATE_GPU,
                                      scheduler_name="default-scheduler", node_selector={
                                          "kubernetes.io/hostname": node}))
    world.cluster.wait_for(lambda: all(world.bound().values()), WAIT, "the busy pods bound")
    idle = nodes[2]
    kept = sorted(i for i in cloud.instances("l4") if i.lower() != idle)
    world.create_policy()
    world.cluster.wait_for(lambda: (world.rounds(1, advance=30.0), cloud.desired("l4") == 2)[1], WAIT,
                           "the idle node removed")
    assert cloud.instances("l4") == kept, "exactly the idle node's instance was terminated"
    world.rounds(1)
    assert world.gpu_nodes() == sorted(k.lower() for k in kept)
    assert all(world.bound().values())


# -- the cloud failing ------------------------------------------------------------------------------
def test_throttling_is_retried_with_back_off_by_botocore(make_world: Any, moto_url: str) -> None:
    calls: dict[str, int] = {}

    def fault(action: str, path: str) -> tuple[int, dict[str, str], bytes] | None:
        if action == "SetDesiredCapacity":
            calls[action] = calls.get(action, 0) + 1
            if calls[action] <= 2:
                return throttled()
        return None
    proxy = FaultProxy(moto_url, fault)
    try:
        world = make_world(endpoint=proxy.url)
        world.cloud.group("l4", "g6.xlarge", pool=world.pool)
        world.create_policy()
        world.pods(1)
        world.rounds(1, agent=False)
        assert world.cloud.desired("l4") == 1
        tries = [at for action, at in proxy.seen if action == "SetDesiredCapacity"]
        assert len(tries) == 3, "two throttled answers, then the call went through"
        # standard mode's back-off: random() x 2^(attempt-1) s before each retry (below 10 ms: p < 3e-5)
        assert tries[2] - tries[0] > 0.01
        world.rounds(2)
        assert world.cloud.desired("l4") == 1 and proxy.count("SetDesiredCapacity") == 3
    finally:
        proxy.close()


def test_throttling_past_the_retries_is_a_status_condition_not_a_crash(make_world: Any, moto_url: str) -> None:
    proxy = FaultProxy(moto_url, lambda action, path: throttled() if action == "SetDesiredCapacity" else None)
    try:
        world = make_world(endpoint=proxy.url, max_attempts=3)
        world.cloud.group("l4", "g6.xlarge", pool=world.pool)
        world.create_policy()
        world.pods(1)
        world.rounds(1, agent=False)
        assert proxy.count("SetDesiredCapacity") == 3, "botocore's max_attempts, all of them throttled"
        condition = world.condition("Provider")
        assert (condition["status"], condition["reason"]) == ("False", "Throttling")
        assert "Rate exceeded" in condition["message"]
        assert world.cloud.desired("l4") == 0
    finally:
        proxy.close()


def test_permission_denied_is_a_status_condition_with_the_clouds_message(make_world: Any, moto_url: str) -> None:
    denied = (b'{"message": "User: arn:aws:sts::123456789012:assumed-role/kubeon/x is not authorized to perform: '
              b'eks:DescribeCluster on resource: arn:aws:eks:us-east-1:123456789012:cluster/c"}')
    proxy = FaultProxy(moto_url, lambda action, path: (403, {"Content-Type": "application/json",
                                                              "x-amzn-ErrorType": "AccessDeniedException"}, denied)
                       if path.startswith("/clusters") else None)
    try:
        world = make_world(endpoint=proxy.url)
        world.cloud.group("l4", "g6.xlarge", pool=world.pool, desired=1)
        world.create_policy()
        world.pods(2)
        world.rounds(2, agent=False)
        condition = world.condition("Provider")
        assert (condition["status"], condition["reason"]) == ("False", "AccessDeniedException")
        assert "is not authorized to perform: eks:DescribeCluster" in condition["message"]
        assert world.cloud.desired("l4") == 1 and not any(a == "SetDesiredCapacity" for a, _ in proxy.seen)
    finally:
        proxy.close()


def test_a_cluster_that_does_not_exist_is_a_status_condition(make_world: Any) -> None:
    world = make_world(eks_cluster="no-such-cluster")
    world.cloud.group("l4", "g6.xlarge", pool=world.pool)
    world.create_policy()
    world.pods(1)
    world.rounds(2, agent=False)
    condition = world.condition("Provider")
    assert (condition["status"], condition["reason"]) == ("False", "ResourceNotFoundException")
    assert "no-such-cluster" in condition["message"]
    assert world.cloud.desired("l4") == 0


def test_no_tagged_group_is_reported_and_nothing_is_launched(make_world: Any) -> None:
    world = make_world()
    world.cloud.group("l4", "g6.xlarge", pool=None)
    world.create_policy()
    world.pods(1)
    world.rounds(2)
    condition = world.condition("NodePool")
    assert (condition["status"], condition["reason"]) == ("False", "NodeGroupNotFound")
    assert f"{GROUP_TAG}={world.pool}" in condition["message"]
    assert world.cloud.desired("l4") == 0

