"""Claim-based GPU pods are packed by the extender's model of DRA state (issue 42, docs/designs/dra.md).

Real: kube-apiserver v1.35 calling the chart's webhook (the `via: DRA` rewrite), the chart's controller
creating the ResourceClaimTemplate, kube-controller-manager making each pod's ResourceClaim, the chart's
`kubeon-gpu-scheduler` (real kube-scheduler v1.35: its DynamicResources plugin allocates the devices)
calling `kubeon-gpu extender`, which watches ResourceSlices and ResourceClaims as its ServiceAccount
(the chart's RBAC), KWOK running the pods. Faked: the GPUs (the NVIDIA DRA driver shim's ResourceSlices,
tests/cluster/dra_driver.py; no device plugin, so nothing advertises `nvidia.com/gpu`).
"""

from __future__ import annotations

from typing import Any

from tests.cluster.cluster import Cluster
from tests.cluster.dra_driver import publish as publish_slices
from tests.cluster.dra_driver import resource_slice
from tests.cluster.objects import make_node, make_pod
from tests.e2e.conftest import in_group, wait_for_policy
from tests.e2e.test_dra import GPU_TAINT, H200, allocated_device, dra_policy, get, kubectl_create

CLUSTER = {"kubeon": True}  # webhook, extender, second scheduler, controller
LAYOUT = ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]  # two devices for a 10Gi pod per node


def pod(name: str, namespace: str, node: str | None = None) -> dict[str, Any]:
    """An unchanged GPU pod (`nvidia.com/gpu: 1`, 10Gi declared) for the chart's scheduler; `node`: pinned there
    by a nodeSelector (the scheduler still allocates its claim)."""
    selector = {**in_group(namespace), **({"kubernetes.io/hostname": node} if node else {})}
    return make_pod(name, namespace, annotations={"gpu.kubeon.io/gpu-memory": "10Gi"}, gpus=1,
                    node_selector=selector)


def running(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.wait_for(
        lambda: next(iter(cluster.pods(namespace, f"app={name}", ready=True)), None), timeout=90,
        message=f"{namespace}/{name} Running")
    return found


def test_claims_fill_the_partly_used_node_and_a_freed_device_is_used_again(kube_cluster: Cluster,
                                                                           namespace: str) -> None:
    cluster = kube_cluster
    a, b = f"{namespace}-a"[-63:], f"{namespace}-b"[-63:]  # b sorts after a: no tie-break favours it
    for node in (a, b):
        cluster.create(make_node(node, None, labels=in_group(namespace), taints=[GPU_TAINT]))
    publish_slices(cluster, [resource_slice(node, H200, 1, LAYOUT) for node in (a, b)])
    cluster.wait_nodes_settled(a, b)
    policy = f"{namespace}-dra"
    kubectl_create(cluster, dra_policy(policy, namespace))
    wait_for_policy(cluster, policy, pod("probe", namespace))

    kubectl_create(cluster, pod("first", namespace, node=b))
    assert running(cluster, namespace, "first")["spec"]["nodeName"] == b
    second = running(cluster, namespace, "second") if kubectl_create(cluster, pod("second", namespace)) else {}
    device = allocated_device(cluster, second)
    assert second["spec"]["nodeName"] == device["node"] == b  # the partly used node, its last 1g.18gb
    assert device["attributes"]["profile"] == {"string": "1g.18gb"}
    # bound by the extender (bindVerb), with no GPU index of ours: the claim's allocation names the device
    assert "gpu.kubeon.io/gpu-index" not in (second["metadata"].get("annotations") or {})

    claim = second["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    cluster.kubectl("delete", "pod", "second", "-n", namespace, "--grace-period=0", "--force")
    cluster.wait_for(lambda: get(cluster, "resourceclaim", claim, namespace) is None, timeout=60,
                     message="the claim deleted with its pod (its device deallocated)")
    kubectl_create(cluster, pod("third", namespace))
    third = running(cluster, namespace, "third")
    # the extender's model freed the device: b is partly used again, and the pod goes there, not to empty a
    assert third["spec"]["nodeName"] == allocated_device(cluster, third)["node"] == b
    cluster.kubectl("delete", "gpupolicy", policy)
