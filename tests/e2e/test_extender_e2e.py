"""GPU pods scheduled by the chart's second kube-scheduler through the real extender land where the policy says.

Real: kube-apiserver v1.35; the chart's `kubeon-gpu-scheduler` (real kube-scheduler v1.35 with the
chart's KubeSchedulerConfiguration: nodeCacheCapable, weight, bindVerb, ignorable) calling
`kubeon-gpu extender` (its own process, as its chart ServiceAccount, watching the cluster) over
HTTP, through a recording proxy (tests/e2e/extender_tap.py) that keeps what the real scheduler
sent; the extender binding through the API; KWOK running the nodes. Faked: the GPUs (node
allocatable is what GFD and the device plugin would publish). Cluster state (nodes, pods pinned
with spec.nodeName, a typeFit GpuPolicy) is created before the extender starts, so its readiness
means it has seen all of it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from tests.cluster.cluster import Cluster
from tests.cluster.gpu_operator import PLUGIN_LABEL
from tests.cluster.objects import make_node, make_pod, required_node_affinity
from tests.e2e.extender_tap import ExtenderTap

# The extender and the second scheduler start in `cluster` below, after the state they must see.
CLUSTER = {"kubeon": True, "kubeon_components": ()}
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
SHARED = "nvidia.com/gpu.shared"
PINNED = "e2e-pinned"
TYPEFIT = "e2e-h100"


def pinned(name: str, node: str, **kwargs: object) -> dict:
    pod = make_pod(name, PINNED, **kwargs)
    pod["spec"]["nodeName"] = node
    return pod


def time_slicing(c: Cluster) -> None:
    """The GPU Operator's time-slicing ConfigMap with a key of 4 renamed shares per GPU: a node
    labelled with that key advertises nvidia.com/gpu.shared (tests/cluster/gpu_operator.py), and
    a T4 node without the label would go back to whole GPUs."""
    config = {"version": "v1", "sharing": {"timeSlicing": {
        "renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    c.create({"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "time-slicing-config", "namespace": "gpu-operator"},
              "data": {"t4-x4": yaml.safe_dump(config)}})


@pytest.fixture(scope="module")
def tap(kube_cluster: Cluster) -> Iterator[ExtenderTap]:
    """The module's nodes, pinned load and typeFit policy; then the extender, and the second
    scheduler calling it through the tap."""
    c = kube_cluster
    c.create(make_node("a100-mig-0", A100, 8, mig={"1g.10gb": 7}, gpu_taint=True))
    c.create(make_node("a100-whole-0", A100, 8))
    # a-drain sorts first and is the tightest fit: only the extender keeps pods off it.
    c.create(make_node("a-drain", A100, 8, labels={"gpu.kubeon.io/draining": "true"}))
    c.create(make_node("b-used", A100, 8))
    c.create(make_node("h100-0", H100, 8))
    time_slicing(c)
    for name in ("ts-a-fresh", "ts-b-used"):
        c.create(make_node(name, "Tesla-T4", 2, shared_replicas=4, labels={PLUGIN_LABEL: "t4-x4"}))
    c.create(pinned("drain-load", "a-drain", gpus=7))
    c.create(pinned("used-load", "b-used", gpus=6))
    c.create(pinned("shared-load", "ts-b-used", gpus=3, gpu_resource=SHARED))
    c.ensure_namespace(TYPEFIT, {"team": "h100"})
    c.create({"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "h100-only"},
              "spec": {"mode": "Automatic", "selector": {"namespaces": [TYPEFIT]},
                       "typeFit": {"allowedModels": [H100]}}})
    c.wait_for(lambda: len(c.pods(PINNED, bound=True, ready=True)) == 3, timeout=60,
               message="pinned pods running")
    assert c.kubeon is not None
    c.kubeon.start_extender(c.api_client)  # its first list sees all of the above
    recorder = ExtenderTap(c.kubeon.extender_url)
    try:
        c.kubeon.start_scheduler(c.api_client, extender_url=recorder.url)
        yield recorder
    finally:
        recorder.close()


def place(c: Cluster, namespace: str, name: str, **kwargs: object) -> str:
    c.create(make_pod(name, namespace, **kwargs))  # schedulerName: kubeon-gpu-scheduler
    [pod] = c.wait_for(lambda: [p for p in c.pods(namespace, bound=True) if p["metadata"]["name"] == name],
                       timeout=60, message=f"{namespace}/{name} bound")
    return str(pod["spec"]["nodeName"])


def test_whole_gpu_pods_fill_the_partly_used_node_and_never_the_draining_one(
        kube_cluster: Cluster, tap: ExtenderTap, namespace: str) -> None:
    before = len(tap.calls)  # the calls of this test only
    placed = [place(kube_cluster, namespace, f"w{i}", gpus=1) for i in range(3)]
    # b-used has 2 free GPUs: the default policy fills it before touching the fresh a100-whole-0;
    # a-drain (1 free, first by name, tightest fit) is never chosen.
    assert placed == ["b-used", "b-used", "a100-whole-0"]
    calls = tap.since(before)
    assert any(verb == "prioritize" for verb, _ in calls)
    scheduling = [args for verb, args in calls if verb in ("filter", "prioritize")]
    assert scheduling and all(set(args) == {"Pod", "Nodes", "NodeNames"} and args["Nodes"] is None
                              for args in scheduling)
    # The chart's profile has a bindVerb: the extender binds, with ExtenderBindingArgs (extender/v1).
    binds = [args for verb, args in calls if verb == "bind"]
    assert len(binds) == 3 and all(set(args) == {"PodName", "PodNamespace", "PodUID", "Node"} for args in binds)
    assert [args["Node"] for args in binds] == placed


def test_time_sliced_pod_goes_to_the_partly_used_node(kube_cluster: Cluster, tap: ExtenderTap,
                                                     namespace: str) -> None:
    assert place(kube_cluster, namespace, "s0", gpus=1, gpu_resource=SHARED) == "ts-b-used"


def test_h100_affinity_never_lands_on_an_a100(kube_cluster: Cluster, tap: ExtenderTap, namespace: str) -> None:
    affinity = required_node_affinity({"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]})
    assert place(kube_cluster, namespace, "h0", gpus=1, affinity=affinity) == "h100-0"


def test_typefit_policy_sends_pods_without_affinity_to_h100(kube_cluster: Cluster, tap: ExtenderTap) -> None:
    # kube-scheduler's own plugins see no constraint; only the extender's typeFit filter does.
    assert [place(kube_cluster, TYPEFIT, f"t{i}", gpus=1) for i in range(2)] == ["h100-0", "h100-0"]
