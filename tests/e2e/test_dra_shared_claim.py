"""The shared ResourceClaim of time-slicing through DRA (docs/designs/dra.md, "Time-slicing through one shared
claim"), as `shared_claim` builds it, on the real control plane: what the design relies on.

Real: kube-apiserver v1.35 accepting the claim `gpupolicy.admission.sharedclaims.shared_claim` builds,
kube-scheduler v1.35's DynamicResources plugin allocating it once for the pods that name it,
kube-controller-manager's resource-claim controller releasing it when they end (so an emptied claim pins
no node), KWOK running the pods. Faked: the GPUs (tests/cluster/dra_driver.py publishes whole-GPU
ResourceSlices as NVIDIA's driver would). Written by hand here: the pods' `resourceClaimName` (the webhook's
rewrite of unchanged pods, and the controller creating the claim, are tests/e2e/test_dra.py's).
"""

from __future__ import annotations

from typing import Any

from gpupolicy.admission.sharedclaims import shared_claim
from gpupolicy.catalog import DEFAULT_CATALOG
from gpupolicy.model import SharingSpec
from tests.cluster.cluster import Cluster
from tests.cluster.objects import make_pod
from tests.e2e.conftest import in_group
from tests.e2e.test_dra import GPU_TAINT, H200, get, h200_nodes, kubectl_create

CLUSTER: dict[str, Any] = {}  # the control plane alone: nothing of ours acts on these pods yet
CLAIM = "kubeon-ts-llm-0"


def share(name: str, namespace: str) -> dict[str, Any]:
    pod = make_pod(name, namespace, scheduler_name=None, node_selector=in_group(namespace),
                   tolerations=[{**GPU_TAINT, "operator": "Exists"}])
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": CLAIM}]
    return pod


def test_pods_naming_the_shared_claim_share_one_device_on_one_node(kube_cluster: Cluster, namespace: str) -> None:
    cluster = kube_cluster
    nodes = h200_nodes(cluster, namespace)
    sharing = SharingSpec.model_validate({"strategy": "TimeSlicing", "replicas": 2, "gpuModels": [H200]})
    kubectl_create(cluster, shared_claim(CLAIM, namespace, sharing, DEFAULT_CATALOG, "llm"))

    for name in ("a", "b"):
        kubectl_create(cluster, share(name, namespace))
    pods = cluster.wait_for(lambda: (lambda ready: ready if len(ready) == 2 else None)(
        [p for n in ("a", "b") for p in cluster.pods(namespace, f"app={n}", ready=True)]),
        timeout=90, message="both pods Running")
    assert pods[0]["spec"]["nodeName"] == pods[1]["spec"]["nodeName"] in nodes
    claim = get(cluster, "resourceclaim", CLAIM, namespace)
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1 and results[0]["pool"] == pods[0]["spec"]["nodeName"]  # one GPU, allocated once
    assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["a", "b"]

    cluster.kubectl("delete", "pod", "a", "b", "-n", namespace, "--wait=true")
    cluster.wait_for(lambda: (lambda c: c is not None and not (c.get("status") or {}).get("allocation"))(
        get(cluster, "resourceclaim", CLAIM, namespace)), timeout=60,
        message="the claim released when its last pod ended (it no longer pins a node)")
