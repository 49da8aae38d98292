"""GPU pods scheduled through the real extender land where the policy says.

Real: the test API server and its loops (tests/kubeapi/cluster.py), the
scheduler stand-in calling `kubeon-gpu extender` (a real gunicorn process
watching the cluster) over HTTP with the upstream wire format and the
chart's KubeSchedulerConfiguration (managedResources, nodeCacheCapable,
weight), binding through the API. Faked: the kubelet/device plugin (node
allocatable is what the node objects say). Cluster state (nodes, pods
pinned with spec.nodeName, a typeFit GpuPolicy) is created before the
extender starts, so its readiness means it has seen all of it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Process
from tests.kubeapi.cluster import Cluster
from tests.cluster.objects import make_node, make_pod, required_node_affinity

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
SHARED = "nvidia.com/gpu.shared"


def pinned(name: str, node: str, **kwargs: object) -> dict:
    pod = make_pod(name, "e2e-pinned", **kwargs)
    pod["spec"]["nodeName"] = node
    return pod


@pytest.fixture(scope="module")
def cluster(e2e_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    c = e2e_cluster
    # a-drain sorts first and is the tightest fit: only the extender keeps pods off it.
    c.create(make_node("a-drain", A100, 8, labels={"gpu.kubeon.io/draining": "true"}))
    c.create(make_node("b-used", A100, 8))
    c.create(make_node("h100-0", H100, 8))
    c.create(make_node("ts-a-fresh", "Tesla-T4", 2, shared_replicas=4))
    c.create(make_node("ts-b-used", "Tesla-T4", 2, shared_replicas=4))
    c.create(pinned("drain-load", "a-drain", gpus=7))
    c.create(pinned("used-load", "b-used", gpus=6))
    c.create(pinned("shared-load", "ts-b-used", gpus=3, gpu_resource=SHARED))
    c.ensure_namespace("e2e-h100", {"team": "h100"})
    c.custom.create_cluster_custom_object("gpu.kubeon.io", "v1alpha1", "gpupolicies", {
        "apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "h100-only"},
        "spec": {"mode": "Automatic", "selector": {"namespaces": ["e2e-h100"]},
                 "typeFit": {"allowedModels": [H100]}}})
    c.wait_for(lambda: len(c.pods("e2e-pinned", bound=True)) == 3, message="pinned pods stored")
    extender: Process = request.getfixturevalue("extender")  # starts now: its first list sees all of the above
    c.use_extenders([extender.config])
    yield c


def place(c: Cluster, namespace: str, name: str, **kwargs: object) -> str:
    c.ensure_namespace(namespace)
    c.create(make_pod(name, namespace, **kwargs))
    [pod] = c.wait_for(lambda: [p for p in c.pods(namespace, bound=True) if p["metadata"]["name"] == name],
                       timeout=20, message=f"{namespace}/{name} bound")
    return str(pod["spec"]["nodeName"])


def test_whole_gpu_pods_fill_the_partly_used_node_and_never_the_draining_one(cluster: Cluster) -> None:
    before = len(cluster.scheduler.extenders[0].calls)  # the calls of this test only
    placed = [place(cluster, "e2e-whole", f"w{i}", gpus=1) for i in range(3)]
    # b-used has 2 free GPUs: the default policy fills it before touching the fresh a100-whole-0;
    # a-drain (1 free, first by name, tightest fit) is never chosen.
    assert placed == ["b-used", "b-used", "a100-whole-0"]
    calls = cluster.scheduler.extenders[0].calls[before:]
    assert any(verb == "prioritize" for verb, _ in calls)
    scheduling = [args for verb, args in calls if verb in ("filter", "prioritize")]
    assert scheduling and all(set(args) == {"Pod", "Nodes", "NodeNames"} and args["Nodes"] is None
                              for args in scheduling)
    # The chart's profile has a bindVerb: the extender binds, with ExtenderBindingArgs (extender/v1).
    binds = [args for verb, args in calls if verb == "bind"]
    assert len(binds) == 3 and all(set(args) == {"PodName", "PodNamespace", "PodUID", "Node"} for args in binds)
    assert [args["Node"] for args in binds] == placed


def test_time_sliced_pod_goes_to_the_partly_used_node(cluster: Cluster) -> None:
    assert place(cluster, "e2e-shared", "s0", gpus=1, gpu_resource=SHARED) == "ts-b-used"


def test_h100_affinity_never_lands_on_an_a100(cluster: Cluster) -> None:
    affinity = required_node_affinity({"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]})
    assert place(cluster, "e2e-affinity", "h0", gpus=1, affinity=affinity) == "h100-0"


def test_typefit_policy_sends_pods_without_affinity_to_h100(cluster: Cluster) -> None:
    # The scheduler stand-in sees no constraint; only the extender's typeFit filter does.
    assert [place(cluster, "e2e-h100", f"t{i}", gpus=1) for i in range(2)] == ["h100-0", "h100-0"]
